"""Properties: cond/switch equal a Python `if`/index over random pytrees, shapes, dtypes."""

import torch
import torch.utils._pytree as pytree
from helpers import examples
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from torchcond import cond, switch

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool]

# Leaf programs per dtype kind; every one keeps its input's dtype and shape.
FLOAT_OPS = [lambda t: t + 1, lambda t: t * 2, torch.neg, torch.sin, lambda t: t.abs().sqrt()]
INT_OPS = [lambda t: t + 1, lambda t: t * 3, torch.neg, torch.abs, lambda t: t // 2]
BOOL_OPS = [torch.logical_not, lambda t: t, lambda t: t & t.flip(-1) if t.dim() else t]


def _ops_for(dtype):
    if dtype is torch.bool:
        return BOOL_OPS
    return FLOAT_OPS if dtype.is_floating_point else INT_OPS


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=dtype)
    return torch.randint(-5, 5, shape, generator=g, dtype=dtype)


def pytrees(leaves):
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, min_size=1, max_size=3),
            st.lists(children, min_size=1, max_size=3).map(tuple),
            st.dictionaries(st.sampled_from("abcd"), children, min_size=1, max_size=3),
        ),
        max_leaves=5,
    )


@st.composite
def programs(draw):
    """A branch: one dtype-preserving op per operand leaf (chosen by leaf position)."""
    choices = draw(st.lists(st.integers(0, 4), min_size=8, max_size=8))

    def branch(*operands):
        leaves, spec = pytree.tree_flatten(operands)
        outs = [
            _ops_for(t.dtype)[choices[i % 8] % len(_ops_for(t.dtype))](t)
            for i, t in enumerate(leaves)
        ]
        return pytree.tree_unflatten(outs, spec)

    return branch


@st.composite
def predicates(draw):
    dtype = draw(st.sampled_from([torch.bool, torch.float32, torch.int64, torch.uint8]))
    shape = draw(st.sampled_from([(), (1,), (1, 1)]))
    value = draw(st.sampled_from([0, 1, 3]))
    return torch.full(shape, value).to(dtype)


operand_lists = st.lists(pytrees(tensors()), min_size=1, max_size=3).map(tuple)
SETTINGS = settings(
    max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TRACE_SETTINGS = settings(
    max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def assert_same(actual, expected):
    assert pytree.tree_structure(actual) == pytree.tree_structure(expected)
    for a, e in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected)):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, equal_nan=True)


@SETTINGS
@given(predicates(), programs(), programs(), operand_lists)
def test_cond_is_python_if_eagerly(pred, t, f, operands):
    expected = t(*operands) if bool(pred) else f(*operands)
    assert_same(cond(pred, t, f, operands), expected)


@SETTINGS
@given(st.integers(-3, 6), st.lists(programs(), min_size=1, max_size=4), operand_lists)
def test_switch_is_clamped_indexing_eagerly(index, branches, operands):
    expected = branches[min(max(index, 0), len(branches) - 1)](*operands)
    assert_same(switch(torch.tensor(index), branches, operands), expected)
    assert_same(switch(index, branches, operands), expected)


@TRACE_SETTINGS
@given(programs(), programs(), operand_lists, st.sampled_from(["fake", "symbolic"]))
def test_cond_after_make_fx_is_python_if(t, f, operands, mode):
    def fn(pred, *ops):
        return cond(pred, t, f, ops)

    gm = make_fx(fn, tracing_mode=mode)(torch.tensor(True), *operands)
    for value in (True, False):
        pred = torch.tensor(value)
        assert_same(gm(pred, *operands), t(*operands) if value else f(*operands))


@TRACE_SETTINGS
@given(st.lists(programs(), min_size=2, max_size=4), operand_lists)
def test_switch_after_make_fx_is_clamped_indexing(branches, operands):
    def fn(index, *ops):
        return switch(index, branches, ops)

    gm = make_fx(fn, tracing_mode="symbolic")(torch.tensor(0), *operands)
    for index in (-1, 0, 1, len(branches) - 1, len(branches) + 2):
        expected = branches[min(max(index, 0), len(branches) - 1)](*operands)
        assert_same(gm(torch.tensor(index), *operands), expected)


# --- layouts: equal dims, different strides ---------------------------------------------

LAYOUTS = [
    lambda t: t,
    lambda t: t.mT,
    lambda t: t.mT.contiguous(),
    lambda t: t.flip(-1),
    lambda t: t.mT[..., ::1],
    lambda t: t.movedim(0, -1) if t.dim() == 3 else t.mT,
]


@TRACE_SETTINGS
@given(
    st.integers(1, 4),
    st.booleans(),
    st.sampled_from(range(len(LAYOUTS))),
    st.sampled_from(range(len(LAYOUTS))),
    st.integers(0, 2**16),
)
def test_branches_with_equal_dims_and_any_strides_trace_to_python_if(n, batched, a, b, seed):
    # Square (or cube) operands: every layout has the same sizes, the strides differ.
    shape = (n, n, n) if batched else (n, n)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    t = lambda x: LAYOUTS[a](x) + 1  # noqa: E731
    f = lambda x: LAYOUTS[b](x) * 2  # noqa: E731
    gm = make_fx(lambda p, x: cond(p, t, f, (x,)), tracing_mode="symbolic")(torch.tensor(True), x)
    for value in (True, False):
        assert_same(gm(torch.tensor(value), x), t(x) if value else f(x))


# --- in-place branches where every branch runs --------------------------------------------

IN_PLACE = [
    lambda t: t.add_(1),
    lambda t: t.mul_(2),
    lambda t: t.view(-1).neg_(),
    lambda t: torch.sin(t, out=t),
    lambda t: t[..., :1].zero_(),
]


@SETTINGS
@given(
    st.sampled_from(range(len(IN_PLACE))),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["select", "vmap"]),
    st.integers(0, 2**16),
)
def test_writes_where_every_branch_runs(op, on_operand, taken, how, seed):
    """A write to an operand lands where its branch is taken; a write to the branch's
    own intermediate is invisible outside: the result is a Python `if`'s."""
    # vmap has no batching rule for out= ops (a Python `if` under vmap fails the same way)
    assume(not (how == "vmap" and op == 3))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
    before = x.clone()

    def writer(x):
        target = x if on_operand else x * 1
        IN_PLACE[op](target)
        return target + 0

    other = lambda x: x - 1  # noqa: E731
    if how == "select":
        run = lambda x: cond(torch.tensor(taken), writer, other, (x,), strategy="select")  # noqa: E731
    else:
        # per-example predicate: row i takes `writer` when taken for row i
        flags = torch.tensor([taken, not taken, taken])
        run = lambda x: torch.vmap(lambda p, r: cond(p, writer, other, (r,)))(flags, x)  # noqa: E731
    out = run(x)
    # The reference: a Python `if` on a copy of the operand (per row under vmap).
    expected_x = before.clone()
    if how == "select":
        expected = writer(expected_x) if taken else other(expected_x)
    else:
        expected = torch.stack(
            [writer(r) if bool(p) else other(r) for p, r in zip(flags, expected_x)]
        )
    assert_same(out, expected)
    assert_same(x, expected_x)


# --- vmap with a per-example predicate and no gradient -------------------------------------

# What each branch returns from its own result `a`, the operand `x`, a closure `w` and
# a number `n` of its own.
OUTPUTS = {
    "tensor": lambda a, x, w, n: a,
    "tuple with the operand and a closure": lambda a, x, w, n: (a, x, w),
    "list": lambda a, x, w, n: [a, a * 2],
    "dict and a number": lambda a, x, w, n: {"a": a, "n": n},
    "nested": lambda a, x, w, n: (a, (x * 1, [w])),
}


@SETTINGS
@given(
    st.sampled_from(["select", "vmap"]),
    st.sampled_from(list(OUTPUTS)),
    st.booleans(),
    st.booleans(),
    st.lists(st.booleans(), min_size=1, max_size=4),
    st.sampled_from([torch.no_grad, torch.inference_mode]),
    st.integers(0, 2**16),
)
def test_every_branch_without_gradient_equals_python_if(
    how, output, t_writes, f_writes, flags, mode, seed
):
    """Without a gradient one C call runs both branches and selects, and hands what it
    does not cover (writes, numbers, dicts, nesting) to the general path, with the calls
    it made. Either way the result is what a Python `if` gives (per example under vmap),
    and so are the operand's writes."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(len(flags), 3, generator=g), torch.randn(3, generator=g)

    def t(x):
        if t_writes:
            x.mul_(2)
        return OUTPUTS[output](x.sin(), x, w, 1.5)

    def f(x):
        if f_writes:
            x.add_(1)
        return OUTPUTS[output](x.cos(), x, w, 2.5)

    refs = x.clone()
    if how == "select":
        expected = [t(refs) if flags[0] else f(refs)]
    else:
        expected = [(t if p else f)(row) for p, row in zip(flags, refs)]
    with mode():
        if how == "select":
            out = cond(torch.tensor(flags[0]), t, f, (x,), strategy="select")
        else:
            out = torch.vmap(lambda p, x: cond(p, t, f, (x,)))(torch.tensor(flags), x)
    assert pytree.tree_structure(out) == pytree.tree_structure(expected[0])
    for i, want in enumerate(expected):
        for got, leaf in zip(pytree.tree_leaves(out), pytree.tree_leaves(want)):
            # A number each branch returns its own of comes back as a tensor.
            got = got if how == "select" else got[i]
            torch.testing.assert_close(got, torch.as_tensor(leaf, dtype=got.dtype))
    torch.testing.assert_close(x, refs)
