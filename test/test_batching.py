"""vmap with per-example predicates, strategy="select", and CUDA graph capture."""

import functools

import pytest
import torch
from helpers import count_nodes
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

import torchcond
from torchcond import BranchMismatchError, BranchMutationError, CondArgumentError, cond, switch
from torchcond._src.api import _ONE_CALL as ONE_CALL

XS = torch.tensor([[1.0, 2.0], [-1.0, -3.0], [0.5, -0.1], [2.0, -0.5]], dtype=torch.float64)


def log_or_zero(x):
    return cond(x.sum() > 0, lambda a: a.log(), lambda a: torch.zeros_like(a), (x,))


def log_or_zero_if(x):
    return x.log() if x.sum() > 0 else torch.zeros_like(x)


def per_example(fn, *batches):
    return torch.stack([fn(*args) for args in zip(*batches)])


# --- vmap over a per-example predicate ----------------------------------------------------


def test_vmap_per_example_predicate_equals_python_if():
    torch.testing.assert_close(
        torch.vmap(log_or_zero)(XS), per_example(log_or_zero_if, XS), equal_nan=True
    )


def test_vmap_of_grad_is_finite_and_exact_per_example():
    got = torch.vmap(torch.func.grad(lambda x: log_or_zero(x).sum()))(XS)
    want = per_example(torch.func.grad(lambda x: log_or_zero_if(x).sum()), XS)
    assert torch.isfinite(got).all()  # log's backward at negative examples never leaks in
    torch.testing.assert_close(got, want)


def test_grad_of_vmap_and_jacrev_of_vmap():
    x = XS.abs().clone().requires_grad_()  # keep log finite for the taken examples
    x.data[1] *= -1
    torch.vmap(log_or_zero)(x).sum().backward()
    assert torch.isfinite(x.grad).all()
    want = per_example(torch.func.grad(lambda t: log_or_zero_if(t).sum()), x.detach())
    torch.testing.assert_close(x.grad, want)
    jac = torch.func.jacrev(torch.vmap(log_or_zero))(x.detach())
    assert torch.isfinite(jac).all()


def test_switch_per_example_index_clamps():
    branches = [lambda a: a * 1, lambda a: a.sin(), lambda a: a * 3]
    index = torch.tensor([0, 1, 7, -2])
    got = torch.vmap(lambda i, x: switch(i, branches, (x,)))(index, XS)
    want = per_example(lambda i, x: branches[min(max(int(i), 0), 2)](x), index, XS)
    torch.testing.assert_close(got, want)


def test_pytree_outputs_and_mixed_in_dims():
    w = torch.tensor([0.5, 2.0], dtype=torch.float64)

    def f(p, x, w):
        return cond(
            p, lambda a, b: {"s": a + b, "t": [a * b]}, lambda a, b: {"s": a - b, "t": [a]}, (x, w)
        )

    preds = torch.tensor([True, False, True, False])
    got = torch.vmap(f, in_dims=(0, 0, None))(preds, XS, w)
    for i, p in enumerate(preds):
        want = f(p, XS[i], w)
        torch.testing.assert_close(got["s"][i], want["s"])
        torch.testing.assert_close(got["t"][0][i], want["t"][0])


def test_nested_vmap_per_element_predicate():
    f = lambda x: cond(x > 0, lambda a: a.sqrt(), lambda a: -a, (x,))  # noqa: E731
    got = torch.vmap(torch.vmap(f))(XS)
    torch.testing.assert_close(got, torch.where(XS > 0, XS.clamp(min=0).sqrt(), -XS))


def test_traced_vmap_with_a_per_example_predicate_has_no_cond_node():
    gm = make_fx(torch.vmap(log_or_zero), tracing_mode="fake")(XS)
    assert count_nodes(gm, "torchcond_cond") == 0
    torch.testing.assert_close(gm(XS), per_example(log_or_zero_if, XS), equal_nan=True)


# --- strategy="select" --------------------------------------------------------------------


@pytest.mark.parametrize("x", [XS[0], XS[1]], ids=["true", "false"])
def test_strategy_select_equals_python_if_with_finite_gradients(x):
    def f(x):
        return cond(x.sum() > 0, torch.log, torch.zeros_like, (x,), strategy="select")

    torch.testing.assert_close(f(x), log_or_zero_if(x))
    got = torch.func.grad(lambda t: f(t).sum())(x)
    want = torch.func.grad(lambda t: log_or_zero_if(t).sum())(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want)


def test_strategy_select_switch_and_pytrees():
    branches = [lambda a: {"v": a + 1}, lambda a: {"v": a * 2}, lambda a: {"v": a.cos()}]
    for i in (-1, 0, 1, 2, 9):
        got = switch(torch.tensor(i), branches, (XS,), strategy="select")
        torch.testing.assert_close(got["v"], branches[min(max(i, 0), 2)](XS)["v"])


def test_strategy_select_traces_to_plain_ops_and_a_select():
    def f(x):
        return cond(x.sum() > 0, torch.sin, torch.cos, (x,), strategy="select")

    gm = make_fx(f, tracing_mode="symbolic")(XS)
    assert count_nodes(gm, "torchcond_cond") == 0
    for x in (XS, -XS):
        torch.testing.assert_close(gm(x), f(x))


def test_strategy_select_with_a_python_bool_just_takes_the_branch():
    calls = []
    cond(
        True,
        lambda a: calls.append("t") or a,
        lambda a: calls.append("f") or a,
        (XS,),
        strategy="select",
    )
    assert calls == ["t"]


# --- CUDA: no host read ---------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_strategy_select_never_syncs_on_cuda():
    x = XS.cuda()
    pred = x.sum() > 0
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = cond(pred, torch.sin, torch.cos, (x,), strategy="select")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(out.cpu(), XS.sin())


@cuda
def test_cond_inside_cuda_graph_capture_takes_both_branches_on_replay():
    x = torch.zeros(4, device="cuda")
    pred = torch.zeros((), dtype=torch.bool, device="cuda")

    def step():
        return cond(pred, lambda a: a + 1, lambda a: a - 1, (x,))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm both branches up before capture
        for value in (True, False):
            pred.fill_(value)
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for value, want in ((True, 1.0), (False, -1.0), (True, 1.0)):
        pred.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), torch.full((4,), want))


def test_compiled_strategy_select_and_per_example_vmap():
    def f(x):
        return cond(x.sum() > 0, torch.log, torch.zeros_like, (x,), strategy="select")

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    x = (-XS[1]).clone().requires_grad_()
    torch.testing.assert_close(compiled(x), f(x))
    (g,) = torch.autograd.grad(compiled(-x).sum(), x)  # log not taken: a finite zero gradient
    assert torch.equal(g, torch.zeros_like(g))
    batched = torch.compile(torch.vmap(log_or_zero), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(batched(XS), per_example(log_or_zero_if, XS), equal_nan=True)


def test_conditional_node_plumbing_with_a_recording_if_body():
    """Without a GPU: each branch runs under its own IF body keyed by `branch == k`, and
    later branches copy their outputs into the first branch's (the graph's fixed outputs)."""
    import contextlib

    from torchcond._src.ops import kind_of, switch_op
    from torchcond._src.strategies import run_as_conditional_nodes

    seen = []

    @contextlib.contextmanager
    def recording_if_body(pred):
        seen.append(bool(pred))
        yield  # a real IF node runs the body only when pred holds on replay

    branches = [lambda a: (a + 1,), lambda a: (a * 2,), lambda a: (a - 5,)]
    x = torch.arange(3.0)
    (out,) = run_as_conditional_nodes(
        kind_of(switch_op), torch.tensor(1), branches, (x,), ["b0", "b1", "b2"], recording_if_body
    )
    assert seen == [False, True, False]
    torch.testing.assert_close(out, x - 5)  # every body ran here, so the last copy wins
    with pytest.raises(Exception, match="agree on shape"):
        run_as_conditional_nodes(
            kind_of(switch_op),
            torch.tensor(0),
            [lambda a: (a,), lambda a: (a[:2],)],
            (x,),
            ["b0", "b1"],
            recording_if_body,
        )


# --- branches that run whether taken or not may not write outside themselves -----------


def _inc(x):
    x.add_(1)
    return x


def _cond_select(p, x):
    return cond(p, _inc, lambda x: x * 2, (x,), strategy="select")


def _switch_select(p, x):
    return switch(p.long(), [lambda x: x * 2, _inc], (x,), strategy="select")


def _vmap_per_example(p, x):
    return torch.vmap(lambda p, r: cond(p, _inc, lambda r: r * 2, (r,)))(p, x)


# name -> (program, tracing mode or None for eager); x is (2, 3), p is (2,) for vmap
_RUN_ALL = {
    "cond select": (_cond_select, None),
    "switch select": (_switch_select, None),
    "make_fx select": (_cond_select, "real"),
    "make_fx fake select": (_cond_select, "fake"),
    "vmap per example": (_vmap_per_example, None),
    "make_fx fake vmap per example": (_vmap_per_example, "fake"),
}


@pytest.mark.parametrize("how", list(_RUN_ALL))
@pytest.mark.parametrize("taken", [True, False])
def test_a_branch_that_runs_untaken_writes_only_where_taken(how, taken):
    # Every branch runs, but a write lands only where its branch is taken, as with a
    # Python `if`: each written operand is selected like an output.
    program, mode = _RUN_ALL[how]
    p = torch.tensor([taken, taken]) if "vmap" in how else torch.tensor(taken)
    x = torch.full((2, 3), 2.0)
    run = program
    if mode is not None:
        traced_on = torch.full((2, 3), 5.0)
        run = make_fx(program, tracing_mode=mode)(
            torch.tensor(True) if "vmap" not in how else torch.tensor([True, False]), traced_on
        )
        if mode == "fake":
            torch.testing.assert_close(traced_on, torch.full((2, 3), 5.0))
    out = run(p, x)
    want = 3.0 if taken else 2.0
    torch.testing.assert_close(x, torch.full((2, 3), want))
    torch.testing.assert_close(out, torch.full((2, 3), want if taken else 4.0))


def test_vmap_per_example_write_lands_in_the_taken_rows():
    xs = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    out = torch.vmap(lambda r: cond(r.sum() > 0, _inc, lambda r: r * 2, (r,)))(xs)
    torch.testing.assert_close(xs, torch.tensor([[2.0, 2.0], [-1.0, -1.0]]))
    torch.testing.assert_close(out, torch.tensor([[2.0, 2.0], [-2.0, -2.0]]))


def test_vmap_per_example_write_to_an_unbatched_operand_is_refused():

    flags, w = torch.tensor([True, False]), torch.zeros(3)
    with pytest.raises(BranchMutationError, match=r"operands\[0\], which is not batched"):
        torch.vmap(lambda p: cond(p, _inc, lambda r: r * 2, (w,)))(flags)
    torch.testing.assert_close(w, torch.zeros(3))


def test_a_select_write_to_an_operand_that_needs_a_gradient_is_refused():

    x = torch.ones(3, requires_grad=True)
    with pytest.raises(BranchMutationError, match=r"operands\[0\], which needs a gradient"):
        cond(torch.tensor(True), lambda x: x.add_(1), lambda x: x * 2, (x * 1,), strategy="select")


def test_a_branch_that_runs_untaken_may_not_write_to_a_closed_over_tensor():

    w, x = torch.zeros(3), torch.ones(3)
    with pytest.raises(
        BranchMutationError,
        match=r"true_fn writes in place .* to a tensor from outside it \(shape \(3,\)\)",
    ):
        cond(torch.tensor(False), lambda x: x + w.add_(1), lambda x: x * 2, (x,), strategy="select")
    with pytest.raises(BranchMutationError, match=r"true_fn writes in place \(aten.sin.out\)"):
        cond(
            torch.tensor(False),
            lambda x: torch.sin(x, out=w),
            lambda x: x * 2,
            (x,),
            strategy="select",
        )
    torch.testing.assert_close(w, torch.zeros(3))


def test_a_branch_that_runs_untaken_may_write_to_what_it_created():
    x = torch.full((3,), 2.0)

    def scratch(x):
        y = x * 1
        y.view(-1).add_(1)  # a view of its own intermediate
        return torch.nn.functional.dropout(y, 0.0, training=True)  # bernoulli_ on a fresh tensor

    for p, want in ((True, 3.0), (False, 4.0)):
        out = cond(torch.tensor(p), scratch, lambda x: x * 2, (x,), strategy="select")
        torch.testing.assert_close(out, torch.full((3,), want))
        out = torch.vmap(
            lambda r, p=p: cond(r.sum() > 0 if p else r.sum() < 0, scratch, lambda r: r * 2, (r,))
        )(x.expand(2, 3))
        torch.testing.assert_close(out, torch.full((2, 3), want))
    torch.testing.assert_close(x, torch.full((3,), 2.0))


def test_vmap_per_example_predicate_with_branches_closing_over_the_batch():
    # No operands: the branches read the batched x from their closure.
    xs = torch.tensor([[1.0, 2.0], [-1.0, -3.0], [0.5, -0.2]])
    out = torch.vmap(lambda x: cond(x.sum() > 0, lambda: x + 1, lambda: x - 1, ()))(xs)
    torch.testing.assert_close(out, torch.stack([x + 1 if x.sum() > 0 else x - 1 for x in xs]))
    out = torch.vmap(lambda x: switch((x.sum() > 0).long(), [lambda: x * 2, lambda: x.sin()], ()))(
        xs
    )
    torch.testing.assert_close(out, torch.stack([x.sin() if x.sum() > 0 else x * 2 for x in xs]))


def test_per_example_gradients_with_branches_closing_over_the_weights():
    # vmap of grad with respect to W, which the branches read from their closure.
    xs = torch.tensor([[1.0, 2.0], [-1.0, -3.0], [0.5, -0.2]], dtype=torch.float64)
    W = torch.randn(2, 2, dtype=torch.float64)

    def loss(x, W):
        return cond(x.sum() > 0, lambda x: (x @ W).sin().sum(), lambda x: (x @ W).cos().sum(), (x,))

    def loss_if(x, W):
        return (x @ W).sin().sum() if x.sum() > 0 else (x @ W).cos().sum()

    got = torch.vmap(torch.func.grad(loss, argnums=1), in_dims=(0, None))(xs, W)
    want = torch.stack([torch.func.grad(loss_if, argnums=1)(x, W) for x in xs])
    torch.testing.assert_close(got, want)
    got = torch.vmap(torch.func.grad(loss), in_dims=(0, None))(xs, W)
    want = torch.stack([torch.func.grad(loss_if)(x, W) for x in xs])
    torch.testing.assert_close(got, want)


# --- every branch runs: no gradient reads an untaken branch, closure or operand --------
# A per-example Python `if` never runs the untaken branch, so its gradients are finite;
# every branch runs here, and sqrt(0), sqrt(-1) and log(-1) must not leak NaN or Inf.

EPS = 1e-3
ROOTS = torch.tensor([0.0, 4.0, -1.0, 2.0, 9.0])


def _sqrt_closure(x):  # the reproducer: the branches read x from their closure
    return cond(x < EPS, lambda: torch.tensor(EPS), lambda: torch.sqrt(x), ())


def _sqrt_operand(x):
    return cond(x < EPS, lambda x: torch.full_like(x, EPS), torch.sqrt, (x,))


def _sqrt_if(x):
    return torch.tensor(EPS) if x < EPS else torch.sqrt(x)


def _switch_index(x):
    return (x > 1).long() + (x > 5).long()


def _switch_closure(x):
    branches = [lambda: x * 0 + 1, lambda: torch.sqrt(x - 1), lambda: torch.log(x - 5)]
    return switch(_switch_index(x), branches, ())


def _switch_operand(x):
    branches = [lambda x: x * 0 + 1, lambda x: torch.sqrt(x - 1), lambda x: torch.log(x - 5)]
    return switch(_switch_index(x), branches, (x,))


def _switch_if(x):
    if x > 5:
        return torch.log(x - 5)
    return torch.sqrt(x - 1) if x > 1 else x * 0 + 1


def _nested(x):  # the inner conditional's branches read the outer one's closure
    inner = lambda: cond(x > 3, lambda: torch.log(x - 3), lambda: torch.sqrt(x), ())  # noqa: E731
    return cond(x < EPS, lambda: x * 2, inner, ())


def _nested_if(x):
    if x < EPS:
        return x * 2
    return torch.log(x - 3) if x > 3 else torch.sqrt(x)


def _read_first_under_no_grad(x):
    def root():
        with torch.no_grad():
            x + 1  # the first read of x: its stand-in must still carry the gradient
        return torch.sqrt(x)

    return cond(x < EPS, lambda: torch.full_like(x, EPS), root, ())


_PROGRAMS = {
    "cond closure": (_sqrt_closure, _sqrt_if),
    "cond operand": (_sqrt_operand, _sqrt_if),
    "switch closure": (_switch_closure, _switch_if),
    "switch operand": (_switch_operand, _switch_if),
    "nested cond closure": (_nested, _nested_if),
    "closure read first under no_grad": (_read_first_under_no_grad, _sqrt_if),
}


def _backward(f, x):
    x = x.clone().requires_grad_()
    f(x).sum().backward()
    return x.grad


def _second_backward(f, x):
    x = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    return h


# name -> derivative of a batched function, taken of vmap(program) and of per-example `if`s
_OVER_THE_BATCH = {
    "grad of vmap": lambda f: torch.func.grad(lambda x: f(x).sum()),
    "backward": lambda f: lambda x: _backward(f, x),
    "autograd.grad twice": lambda f: lambda x: _second_backward(f, x),
    "jacrev of vmap": torch.func.jacrev,
    "jacfwd of vmap": torch.func.jacfwd,
    "hessian of vmap": lambda f: torch.func.hessian(lambda x: f(x).sum()),
}

# name -> derivative of one example's function, then vmapped (or looped over examples)
_PER_EXAMPLE = {
    "vmap of grad": torch.func.grad,
    "vmap of jacrev": torch.func.jacrev,
    "vmap of jacfwd": torch.func.jacfwd,
    "vmap of hessian": torch.func.hessian,
}


@pytest.mark.parametrize("program", list(_PROGRAMS))
@pytest.mark.parametrize("transform", list(_OVER_THE_BATCH))
def test_derivatives_over_a_vmap_never_read_an_untaken_branch(program, transform):
    f, f_if = _PROGRAMS[program]
    derivative = _OVER_THE_BATCH[transform]
    got = derivative(torch.vmap(f))(ROOTS)
    want = derivative(lambda x: per_example(f_if, x))(ROOTS)
    assert not want.isnan().any()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("program", list(_PROGRAMS))
@pytest.mark.parametrize("transform", list(_PER_EXAMPLE))
def test_per_example_derivatives_never_read_an_untaken_branch(program, transform):
    f, f_if = _PROGRAMS[program]
    derivative = _PER_EXAMPLE[transform]
    got = torch.vmap(derivative(f))(ROOTS)
    want = per_example(derivative(f_if), ROOTS)
    assert not want.isnan().any()
    torch.testing.assert_close(got, want)


def test_a_closed_over_parameter_gets_only_the_taken_examples_gradient():
    # sqrt(w * 0) at the untaken examples would give 0 * inf = NaN to w.
    xs = torch.tensor([0.0, 4.0, -1.0, 0.0, 9.0])

    def f(x, w):
        return cond(x > 0, lambda: torch.sqrt(w * x), lambda: x * 0, ())

    def f_if(x, w):
        return torch.sqrt(w * x) if x > 0 else x * 0

    w = torch.tensor(1.0, requires_grad=True)
    torch.vmap(f, in_dims=(0, None))(xs, w).sum().backward()
    w_if = torch.tensor(1.0, requires_grad=True)
    per_example(lambda x: f_if(x, w_if), xs).sum().backward()
    torch.testing.assert_close(w.grad, w_if.grad)
    got = torch.func.grad(lambda w: torch.vmap(f, in_dims=(0, None))(xs, w).sum())(w.detach())
    torch.testing.assert_close(got, w_if.grad)
    got = torch.vmap(torch.func.grad(f, argnums=1), in_dims=(0, None))(xs, w.detach())
    torch.testing.assert_close(got, per_example(torch.func.grad(f_if, argnums=1), xs, [w] * 5))


@pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])
def test_traced_gradient_of_vmap_never_reads_an_untaken_branch(tracing_mode):
    g = torch.func.grad(lambda x: torch.vmap(_sqrt_closure)(x).sum())
    gm = make_fx(g, tracing_mode=tracing_mode)(ROOTS)
    want = torch.func.grad(lambda x: per_example(_sqrt_if, x).sum())(ROOTS)
    torch.testing.assert_close(gm(ROOTS), want)


@pytest.mark.parametrize("root", [0.0, 4.0])
def test_strategy_select_masks_a_closed_over_tensor_that_needs_a_gradient(root):
    def f(x):
        return cond(
            x < EPS, lambda: torch.tensor(EPS), lambda: torch.sqrt(x), (), strategy="select"
        )

    def g(x):
        branches = [lambda: torch.tensor(EPS), lambda: torch.sqrt(x), lambda: torch.log(x - 9)]
        return switch(_switch_index(x), branches, (), strategy="select")

    want = torch.func.grad(_sqrt_if)(torch.tensor(root))
    for program in (f, g):
        torch.testing.assert_close(_backward(program, torch.tensor(root)), want)
        torch.testing.assert_close(torch.func.grad(program)(torch.tensor(root)), want)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(_backward(compiled, torch.tensor(root)), want)


def test_a_branch_that_runs_untaken_may_not_write_to_a_closure_that_needs_a_gradient():
    # The branch reads a masked stand-in of w; a write to it would be lost, so it is
    # refused as a write to w would be.

    w = torch.ones(2, requires_grad=True) * 1
    with pytest.raises(BranchMutationError, match=r"true_fn writes in place .* from outside it"):
        cond(torch.tensor(True), lambda: w.mul_(2), lambda: w * 1, (), strategy="select")
    with pytest.raises(BranchMutationError, match=r"true_fn writes in place .* from outside it"):
        torch.vmap(lambda x: cond(x > 0, lambda: w.mul_(2).sum() + x, lambda: x, ()))(ROOTS)
    torch.testing.assert_close(w, torch.ones(2))


# --- an output every branch returns unchanged keeps its batching -------------------------


def test_an_operand_every_branch_returns_unchanged_stays_unbatched():
    def f(p, x, y):
        return cond(p, lambda x, y: (x, y + 1), lambda x, y: (x, y * 2), (x, y))

    p, x, y = torch.tensor([True, False]), torch.ones(3), torch.arange(6.0).view(2, 3)
    out_x, out_y = torch.vmap(f, in_dims=(0, None, 0), out_dims=(None, 0))(p, x, y)
    assert out_x is x  # as a Python `if` returns it, whichever branch it takes
    torch.testing.assert_close(out_y, per_example(lambda p, y: f(p, x, y)[1], p, y))

    branches = [lambda x: (x, x * 0), lambda x: (x, x + 1), lambda x: (x, x.cos())]
    g = lambda i, x: switch(i, branches, (x,))  # noqa: E731
    index = torch.tensor([2, 0, 1, 7])
    out_x, out_y = torch.vmap(g, in_dims=(0, None), out_dims=(None, 0))(index, x)
    assert out_x is x
    torch.testing.assert_close(out_y, per_example(lambda i: g(i, x)[1], index))


def test_the_same_closed_over_tensor_from_every_branch_stays_unbatched():
    w, v = torch.ones(3), torch.zeros(3)
    same = lambda p: cond(p, lambda: w, lambda: w, ())  # noqa: E731
    flags = torch.tensor([True, False])
    assert torch.vmap(same, out_dims=None)(flags) is w
    # Different tensors differ per example: selected, so batched.
    different = lambda p: cond(p, lambda: w, lambda: v, ())  # noqa: E731
    got = torch.vmap(different)(flags)
    torch.testing.assert_close(got, per_example(lambda p: w if p else v, flags))
    with pytest.raises(ValueError, match="out_dim is None"):
        torch.vmap(different, out_dims=None)(flags)


def test_gradients_through_an_unchanged_output_and_a_masked_one():
    # x flows out unchanged from every branch (gradient 1 whichever is taken) and into
    # sqrt in one branch (gradient only where that branch is taken).
    def f(p, x, y):
        return cond(p, lambda x, y: (x, torch.sqrt(x) * y), lambda x, y: (x, y), (x, y))

    def f_if(p, x, y):
        return (x, torch.sqrt(x) * y) if p else (x, y)

    p, y = torch.tensor([False, True, False]), torch.ones(3, 2)
    x = torch.tensor([0.0, 4.0])

    def loss(f, x):
        out_x, out_y = f(x)
        return out_x.sum() + out_y.sum()

    batched = lambda x: torch.vmap(f, in_dims=(0, None, 0), out_dims=(None, 0))(p, x, y)  # noqa: E731
    looped = lambda x: (x, per_example(lambda p, y: f_if(p, x, y)[1], p, y))  # noqa: E731
    want = torch.func.grad(lambda x: loss(looped, x))(x)
    assert not want.isnan().any()
    torch.testing.assert_close(torch.func.grad(lambda x: loss(batched, x))(x), want)
    torch.testing.assert_close(_backward(lambda x: loss(batched, x), x), want)


def test_strategy_select_returns_an_operand_every_branch_returns_unchanged():
    x = torch.ones(3)
    out = cond(
        torch.tensor(True), lambda x: (x, x + 1), lambda x: (x, x * 2), (x,), strategy="select"
    )
    assert out[0] is x
    torch.testing.assert_close(out[1], x + 1)


def test_map_conditional_with_a_batched_selector_equals_python_if():
    # The rule autograd.DifferentiableConditional.vmap uses, with the selector batched too.
    from torchcond._src.batching import map_conditional
    from torchcond._src.ops import cond_op, kind_of

    p = torch.tensor([True, False, True])
    xs = torch.tensor([[1.0, 0.0, 4.0], [4.0, 9.0, 0.0]])  # batched along dim 1
    w = torch.tensor([10.0, 20.0])
    branches = [lambda x, w: (x.sqrt() + w, w), lambda x, w: (x - w, w)]
    got = map_conditional(kind_of(cond_op), p, 0, branches, (xs, w), (1, None), 3, "error")
    want = [
        per_example(lambda p, x, j=j: branches[0 if p else 1](x, w)[j], p, xs.t()) for j in (0, 1)
    ]
    torch.testing.assert_close(list(got), want)


@pytest.mark.parametrize("shared", [True, False])
def test_a_nested_conditional_with_a_shared_predicate_in_a_branch_that_runs_untaken(shared):
    # The inner predicate is readable: a Python `if` at the transform's level, although
    # the outer branch runs under the recorder of its writes (a dispatch mode).
    q = torch.tensor(shared)

    def f(x, q):
        inner = lambda: cond(q, lambda y: torch.sqrt(x) + y, lambda y: torch.log(x) + y, (x,))  # noqa: E731
        return cond(x < EPS, lambda: x * 2, inner, ())

    def f_if(x, q):
        if x < EPS:
            return x * 2
        return torch.sqrt(x) + x if q else torch.log(x) + x

    def batched(x):
        return torch.vmap(f, in_dims=(0, None))(x, q)

    want = torch.func.grad(lambda x: per_example(lambda x: f_if(x, q), x).sum())(ROOTS)
    assert not want.isnan().any()
    torch.testing.assert_close(torch.func.grad(lambda x: batched(x).sum())(ROOTS), want)
    torch.testing.assert_close(_backward(batched, ROOTS), want)
    torch.testing.assert_close(torch.vmap(torch.func.grad(f), in_dims=(0, None))(ROOTS, q), want)


# --- a shared selector, traced: one conditional of mapped branches -----------------------

TRACING_MODES = pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])


@TRACING_MODES
def test_traced_vmap_with_a_shared_predicate_and_branches_closing_over_the_batch(tracing_mode):
    # No operands: the branches read the batched x (and the shared y) from their closure.
    def f(x, y, p):
        return cond(p, lambda: x.sqrt() * y, lambda: x * y, ())

    def f_if(x, y, p):
        return x.sqrt() * y if p else x * y

    mapped = lambda x, y, p: torch.vmap(f, in_dims=(0, None, None))(x, y, p)  # noqa: E731
    x, y = torch.tensor([1.0, 4.0, 9.0]), torch.tensor(2.0)
    traced = make_fx(mapped, tracing_mode=tracing_mode)(x, y, torch.tensor(True))
    assert count_nodes(traced, "torchcond_cond") == 1
    for p in (True, False):
        p = torch.tensor(p)
        torch.testing.assert_close(traced(x, y, p), per_example(lambda x, p=p: f_if(x, y, p), x))


@TRACING_MODES
def test_traced_vmap_with_a_shared_predicate_returns_an_unchanged_operand_unbatched(
    tracing_mode,
):
    def f(x, y, p):
        return cond(p, lambda x, y: (x.sin(), y), lambda x, y: (x.cos(), y), (x, y))

    mapped = lambda x, y, p: torch.vmap(f, in_dims=(0, None, None), out_dims=(0, None))(x, y, p)  # noqa: E731
    x, y = torch.tensor([0.5, 1.0, 2.0]), torch.tensor([3.0, 4.0])
    traced = make_fx(mapped, tracing_mode=tracing_mode)(x, y, torch.tensor(True))
    for p in (True, False):
        out_x, out_y = traced(x, y, torch.tensor(p))
        torch.testing.assert_close(out_x, x.sin() if p else x.cos())
        torch.testing.assert_close(out_y, y)


def _check_traced_gradient_of_vmap(f, f_if, tracing_mode):
    """make_fx of grad over vmap(f) with a shared predicate equals grad of the per-example if."""

    def grads(f):
        def g(x, w, p):
            loss = lambda x, w: torch.vmap(f, in_dims=(0, None, None))(x, w, p).sum()  # noqa: E731
            return torch.func.grad(loss, argnums=(0, 1))(x, w)

        return g

    x, w = torch.tensor([[1.0, 4.0], [9.0, 0.25]]), torch.tensor([0.5, -1.5])
    traced = make_fx(grads(f), tracing_mode=tracing_mode)(x, w, torch.tensor(True))
    for p in (True, False):
        p = torch.tensor(p)
        want = torch.func.grad(
            lambda x, w, p=p: per_example(lambda x: f_if(x, w, p), x).sum(), argnums=(0, 1)
        )(x, w)
        torch.testing.assert_close(traced(x, w, p), want)


@TRACING_MODES
def test_traced_gradient_of_vmap_with_a_shared_predicate_reaches_the_closures(tracing_mode):
    # grad outside vmap: the branches close over the batched x and the differentiated w.
    def f(x, w, p):
        return cond(p, lambda: (x.sqrt() * w).sum(), lambda: (x * w).sin().sum(), ())

    def f_if(x, w, p):
        return (x.sqrt() * w).sum() if p else (x * w).sin().sum()

    _check_traced_gradient_of_vmap(f, f_if, tracing_mode)


@TRACING_MODES
def test_traced_gradient_of_vmap_with_a_shared_predicate_and_an_operand_also_closed_over(
    tracing_mode,
):
    def f(x, w, p):
        return cond(p, lambda a: (a * x.sin() * w).sum(), lambda a: (a + x * w).sum(), (x,))

    def f_if(x, w, p):
        return (x * x.sin() * w).sum() if p else (x + x * w).sum()

    _check_traced_gradient_of_vmap(f, f_if, tracing_mode)


def test_jacrev_of_a_branch_that_reads_a_size_made_from_data():
    # jacrev vmaps the derivative graphs, which query a size nonzero made (sym_size).
    def rows(x):
        return (x > 1).nonzero().size(0) + 1

    def f(x, p):
        return cond(
            p, lambda x: x * torch.ones(rows(x)).cos(), lambda x: x * torch.ones(rows(x)), (x,)
        )

    def f_if(x, p):
        return x * torch.ones(rows(x)).cos() if p else x * torch.ones(rows(x))

    x = torch.tensor(1.5)
    trace = functools.partial(make_fx, tracing_mode="fake")
    try:
        trace(lambda x: torch.func.jacrev(f_if)(x, True))(x)
    except GuardOnDataDependentSymNode:
        # torch 2.11's jacrev reads the output's size as an int, so it traces this
        # with no conditional either; torchcond fails the same way, not otherwise.
        with pytest.raises(GuardOnDataDependentSymNode):
            trace(lambda x, p: torch.func.jacrev(f)(x, p))(x, torch.tensor(True))
        return
    traced = trace(lambda x, p: torch.func.jacrev(f)(x, p))(x, torch.tensor(True))
    # Compiled, jacrev maps the derivative over a batch of that data-dependent size:
    # the branches' outputs share it, and merged they keep it (no fresh size, which
    # dynamo would then query on a batched value).
    compiled = torch.compile(lambda x, p: torch.func.jacrev(f)(x, p), backend="aot_eager")
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        for p in (True, False):
            want = torch.func.jacrev(f_if)(x, p)
            torch.testing.assert_close(traced(x, torch.tensor(p)), want)
            torch.testing.assert_close(compiled(x, torch.tensor(p)), want)


@pytest.mark.parametrize("tracing_mode", ["real", "fake"])
def test_traced_per_example_gradient_through_a_nested_switch(tracing_mode):
    # The inner switch's selector is closed over; every branch of it reads the outer
    # branch's operand. Each inner branch must read that operand, not a stand-in made
    # while a sibling branch was traced (which became a constant: zero gradients).
    def f(x, y, s):
        inner = (y > 1.6).long()

        def nested(x):
            return switch(inner, [torch.sin, torch.cos, torch.tanh], (x,))

        return switch(s, [nested, lambda x: 2 * x, torch.exp], (x,))

    def python_if(x, y, s):
        branches = [[torch.sin, torch.cos, torch.tanh][int(y > 1.6)], lambda x: 2 * x, torch.exp]
        return branches[min(max(int(s), 0), 2)](x)

    per_example = torch.vmap(torch.func.grad(f), in_dims=(0, None, 0))
    x, y, s = torch.tensor([1.1, 1.5, 1.0]), torch.tensor(1.7), torch.tensor([0, -1, 1])
    traced = make_fx(per_example, tracing_mode=tracing_mode)(x, y, s)
    want = torch.stack([torch.func.grad(python_if)(*a) for a in zip(x, [y] * 3, s)])
    torch.testing.assert_close(traced(x, y, s), want)
    torch.testing.assert_close(per_example(x, y, s), want)


# --- without a gradient, one C call -----------------------------------------------------


def _t(x):
    return x.sin() * 2


def _f(x):
    return x.cos()


FLAGS = torch.tensor([True, False, False, True])


def test_without_a_gradient_a_per_example_cond_is_one_c_call():
    # The call api.cond makes; None would mean the general path.
    def direct(p, x):
        out = torchcond._C.per_example_cond(ONE_CALL, p, _t, _f, (x,))
        assert out is not None
        return out

    with torch.no_grad():
        got = torch.vmap(direct)(FLAGS, XS)
    torch.testing.assert_close(got, per_example(lambda p, x: _t(x) if p else _f(x), FLAGS, XS))
    # A gradient, a predicate of another dtype, a builtin branch: the general path.
    answers = []

    def general(p, x, t):
        answers.append(torchcond._C.per_example_cond(ONE_CALL, p, t, _f, (x,)))
        return x

    for p, t, grad in ((FLAGS, _t, True), (FLAGS.double(), _t, False), (FLAGS, torch.sin, False)):
        with torch.set_grad_enabled(grad):
            torch.vmap(functools.partial(general, t=t))(p, XS)
    assert answers == [None, None, None]


def test_without_a_gradient_a_per_example_cond_raises_what_the_general_path_does():
    with (
        torch.no_grad(),
        pytest.raises(BranchMismatchError, match="branches must agree on shape"),
    ):
        torch.vmap(lambda p, x: cond(p, lambda x: x, lambda x: x[:1], (x,)))(FLAGS, XS)
    with (
        torch.no_grad(),
        pytest.raises(CondArgumentError, match="true_fn is called with the 1 operand"),
    ):
        torch.vmap(lambda p, x: cond(p, lambda: x, _f, (x,)))(FLAGS, XS)


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, p, x):
        def t(x):
            self.count = self.count + 1
            return x * 2

        return cond(p, t, lambda x: x * 3, (x,))


def test_without_a_gradient_a_per_example_cond_refuses_a_buffer_assignment_and_keeps_it():
    m = _Counter()
    count = m.count
    with torch.no_grad(), pytest.raises(BranchMutationError, match=r"true_fn assigns .*count"):
        torch.vmap(m)(FLAGS, XS)
    assert m.count is count and m.count.item() == 0
