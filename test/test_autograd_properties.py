"""Property: first and second derivatives through cond/switch equal a Python `if`.

Random small programs fill the branches; each example is checked eagerly and through
a traced graph (where the derivatives are themselves conds), on both branches.
"""

import torch
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from torchcond import cond, switch

UNARY = [
    torch.sin,
    torch.tanh,
    torch.sigmoid,
    lambda t: t * t,
    lambda t: (0.5 * t).exp(),
    lambda t: t * 3.0 - 1.0,
    lambda t: t.detach() * t,  # a stop-gradient inside the branch
]
BINARY = [torch.add, torch.mul, lambda a, b: a * b.cos()]


@st.composite
def programs(draw):
    """``(a, b) -> tensor``: a chain of unary ops on each input, then one combination."""
    left = draw(st.lists(st.sampled_from(range(len(UNARY))), min_size=1, max_size=3))
    right = draw(st.lists(st.sampled_from(range(len(UNARY))), max_size=2))
    combine = draw(st.sampled_from(range(len(BINARY))))

    def program(a, b):
        for i in left:
            a = UNARY[i](a)
        for i in right:
            b = UNARY[i](b)
        return BINARY[combine](a, b)

    return program


def derivatives(f, x, y):
    """f's value, first and second derivatives w.r.t. x and y (create_graph through both)."""
    out = f(x, y)
    gx, gy = torch.autograd.grad(out.sum(), (x, y), create_graph=True, allow_unused=True)
    gx = torch.zeros_like(x) if gx is None else gx
    gy = torch.zeros_like(y) if gy is None else gy
    second = (gx * gx).sum() + gy.sum()
    if not second.requires_grad:  # a program linear in both inputs
        return out, gx, gy, None, None
    ggx, ggy = torch.autograd.grad(second, (x, y), allow_unused=True)
    return out, gx, gy, ggx, ggy


def same(got, want):
    """Traced graphs give zeros where eager gives None (an input the branch does not use)."""
    for g, w in zip(got, want):
        if g is None or w is None:
            assert (g if w is None else w) is None or not (g if w is None else w).any()
        else:
            torch.testing.assert_close(g, w)


def inputs(seed, sign):
    g = torch.Generator().manual_seed(seed)
    x = (sign * (torch.rand(4, generator=g, dtype=torch.float64) + 0.1)).requires_grad_()
    y = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()
    return x, y


@settings(max_examples=examples(12), deadline=None)
@given(programs(), programs(), st.integers(0, 2**16))
def test_cond_derivatives_equal_python_if(true_prog, false_prog, seed):
    def with_cond(x, y):
        return cond(x.sum() > 0, true_prog, false_prog, (x, y))

    def with_if(x, y):
        return true_prog(x, y) if x.sum() > 0 else false_prog(x, y)

    traced = make_fx(lambda x, y: derivatives(with_cond, x, y), tracing_mode="fake")(
        *inputs(seed, 1.0)
    )
    for sign in (1.0, -1.0):
        want = derivatives(with_if, *inputs(seed, sign))
        same(derivatives(with_cond, *inputs(seed, sign)), want)
        same(traced(*inputs(seed, sign)), want)


@settings(max_examples=examples(4), deadline=None)
@given(st.lists(programs(), min_size=2, max_size=4), st.integers(0, 2**16))
def test_switch_derivatives_equal_python_indexing(branches, seed):
    def with_switch(i, x, y):
        return switch(i, branches, (x, y))

    traced = make_fx(
        lambda i, x, y: derivatives(lambda a, b: with_switch(i, a, b), x, y),
        tracing_mode="fake",
    )(torch.tensor(0), *inputs(seed, 1.0))
    for i in range(len(branches)):
        want = derivatives(branches[i], *inputs(seed, 1.0))
        same(traced(torch.tensor(i), *inputs(seed, 1.0)), want)


# --- grad mode and custom autograd.Functions inside branches ------------------------------


class _StraightThrough(torch.autograd.Function):
    """round() forward, identity backward: what quantization-aware training uses."""

    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, g):
        return g * 3  # distinguishable from any derivative of round()


PIECES = [
    lambda x: x.sin(),
    lambda x: x * _no_grad_sum(x),
    lambda x: _StraightThrough.apply(x * 2),
    lambda x: x * x.detach(),
    lambda x: x.exp() * _StraightThrough.apply(x),
]


def _no_grad_sum(x):
    with torch.no_grad():
        return x.sum()


@settings(max_examples=examples(4), deadline=None)
@given(
    st.sampled_from(range(len(PIECES))), st.sampled_from(range(len(PIECES))), st.integers(0, 2**16)
)
def test_grad_mode_and_custom_function_branches_equal_python_if(a, b, seed):
    # Eagerly and under torch.compile the branch's own autograd runs: no_grad blocks
    # and a custom backward count exactly as in a Python `if`.
    t, f = PIECES[a], PIECES[b]

    def loss(fn, x):
        return fn(x).sum()

    with_cond = lambda x: cond(x.sum() > 0, t, f, (x,))  # noqa: E731
    with_if = lambda x: t(x) if x.sum() > 0 else f(x)  # noqa: E731
    torch._dynamo.reset()  # one code object for every example: past the recompile limit dynamo would run it eagerly
    compiled = torch.compile(with_cond, backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(4, generator=g, dtype=torch.float64) + 0.1
    for sign in (1.0, -1.0):
        x = (sign * base).requires_grad_()
        (want,) = torch.autograd.grad(loss(with_if, x), x)
        for fn in (with_cond, compiled):
            x = (sign * base).requires_grad_()
            (got,) = torch.autograd.grad(loss(fn, x), x)
            torch.testing.assert_close(got, want)


@settings(max_examples=examples(4), deadline=None)
@given(
    st.sampled_from(range(len(PIECES))), st.sampled_from(range(len(PIECES))), st.integers(0, 2**16)
)
def test_grad_mode_and_custom_function_branches_traced_equal_python_if(a, b, seed):
    # A traced graph is differentiated by re-running it: nodes the branch computed
    # under no_grad re-run under no_grad. A custom Function's backward is in no
    # graph: those derivatives are traced from the branch itself. First and second
    # order.
    t, f = PIECES[a], PIECES[b]

    def with_cond(x, y):
        return cond(x.sum() > 0, lambda p, q: t(p) * q, lambda p, q: f(p) + q, (x, y))

    def with_if(x, y):
        return t(x) * y if x.sum() > 0 else f(x) + y

    traced = make_fx(lambda x, y: derivatives(with_cond, x, y), tracing_mode="symbolic")(
        *inputs(seed, 1.0)
    )
    for sign in (1.0, -1.0):
        same(traced(*inputs(seed, sign)), derivatives(with_if, *inputs(seed, sign)))


# --- random draws inside branches -------------------------------------------------------

DRAWING = [
    lambda x: torch.nn.functional.dropout(x, 0.3, training=True),
    lambda x: x * torch.rand_like(x),
    lambda x: torch.bernoulli(x.sigmoid()) * x.cos(),
    lambda x: torch.nn.functional.alpha_dropout(x, 0.2, training=True) * x,
    lambda x: x.sin(),  # no draw: mixed with a drawing branch
    lambda x: cond(x.sum() > 2.4, DRAWING[0], DRAWING[1], (x,)),  # draws one level down
]


def _seeded(fn, *args):
    torch.manual_seed(1234)
    return fn(*args)


@settings(max_examples=examples(6), deadline=None)
@given(
    st.lists(st.sampled_from(range(len(DRAWING))), min_size=2, max_size=3),
    st.sampled_from(["fake", "symbolic"]),
    st.integers(0, 2**16),
)
def test_drawing_branches_traced_equal_python_if_with_the_same_seed(picks, mode, seed):
    # The traced derivative replays the forward's draws; eager draws once. Both draw the
    # same numbers from the same seed, so values and first/second derivatives agree.
    branches = [lambda p, q, f=DRAWING[i]: f(p) * q for i in picks]

    def with_switch(i, x, y):
        return switch(i, branches, (x, y))

    traced = make_fx(
        lambda i, x, y: derivatives(lambda a, b: with_switch(i, a, b), x, y), tracing_mode=mode
    )(torch.tensor(0), *inputs(seed, 1.0))
    for i in range(len(branches)):
        want = _seeded(derivatives, branches[i], *inputs(seed, 1.0))
        same(_seeded(traced, torch.tensor(i), *inputs(seed, 1.0)), want)
