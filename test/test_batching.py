"""vmap with per-example predicates, strategy="select", and CUDA graph capture."""

import pytest
import torch
from helpers import count_nodes
from torch.fx.experimental.proxy_tensor import make_fx

from torchcond import cond, switch

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

    from torchcond._src.ops import form_of, switch_op
    from torchcond._src.strategies import run_as_conditional_nodes

    seen = []

    @contextlib.contextmanager
    def recording_if_body(pred):
        seen.append(bool(pred))
        yield  # a real IF node runs the body only when pred holds on replay

    branches = [lambda a: (a + 1,), lambda a: (a * 2,), lambda a: (a - 5,)]
    x = torch.arange(3.0)
    (out,) = run_as_conditional_nodes(
        form_of(switch_op), torch.tensor(1), branches, (x,), ["b0", "b1", "b2"], recording_if_body
    )
    assert seen == [False, True, False]
    torch.testing.assert_close(out, x - 5)  # every body ran here, so the last copy wins
    with pytest.raises(Exception, match="agree on shape"):
        run_as_conditional_nodes(
            form_of(switch_op),
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
    from torchcond import BranchMutationError

    flags, w = torch.tensor([True, False]), torch.zeros(3)
    with pytest.raises(BranchMutationError, match=r"operands\[0\], which is not batched"):
        torch.vmap(lambda p: cond(p, _inc, lambda r: r * 2, (w,)))(flags)
    torch.testing.assert_close(w, torch.zeros(3))


def test_a_select_write_to_an_operand_that_needs_a_gradient_is_refused():
    from torchcond import BranchMutationError

    x = torch.ones(3, requires_grad=True)
    with pytest.raises(BranchMutationError, match=r"operands\[0\], which needs a gradient"):
        cond(torch.tensor(True), lambda x: x.add_(1), lambda x: x * 2, (x * 1,), strategy="select")


def test_a_branch_that_runs_untaken_may_not_write_to_a_closed_over_tensor():
    from torchcond import BranchMutationError

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
