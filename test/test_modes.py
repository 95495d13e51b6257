"""Conditionals under dispatch modes that trace nothing, FlopCounterMode, and the profiler.

A user's TorchDispatchMode sees what a Python ``if`` would show it; a mode that takes
higher-order operators (DebugMode) gets the operator, as it gets ``torch.cond``;
FlopCounterMode counts what it counts for ``torch.cond``; a profiler shows a range per
conditional and one for the branch taken.
"""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from torchcond import cond, switch
from torchcond.errors import CondArgumentError

W = torch.randn(4, 4)
POS, NEG = torch.full((3, 4), 0.5), torch.full((3, 4), -0.5)


class Log(TorchDispatchMode):
    """A user's mode with no rule for torchcond's operators: it records what it sees."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class TakesHops(Log):
    """A mode that takes higher-order operators (torch's contract), optionally declining."""

    def __init__(self, decline=False):
        super().__init__()
        self.supports_higher_order_operators = True
        self.decline = decline

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, torch._ops.HigherOrderOperator):
            self.ops.append(f"HOP {func.name()}")
            return NotImplemented if self.decline else func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


def logged(fn, *args):
    with Log() as mode:
        out = fn(*args)
    return out, mode.ops


# --- the programs: torchcond, the same code as a Python `if`, torch.cond --------------


def ours(x):
    return cond(x.sum() > 0, lambda x: (x @ W).relu(), lambda x: x * 2, (x,))


def python_if(x):
    return (x @ W).relu() if x.sum() > 0 else x * 2


def torchs(x):
    return torch.cond(x.sum() > 0, lambda x: (x @ W).relu(), lambda x: x * 2, (x,))


class Model(torch.nn.Module):
    def __init__(self, use_torch_cond=False):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.use_torch_cond = use_torch_cond

    def forward(self, x):
        conditional = torch.cond if self.use_torch_cond else cond
        return conditional(x.sum() > 0, lambda x: self.a(x).relu(), self.twice_b, (x,))

    def twice_b(self, x):
        return self.b(self.b(x))


def model_python_if(m, x):
    return m.a(x).relu() if x.sum() > 0 else m.twice_b(x)


def torch_cond_traced(fn, *args):
    # torch.cond run eagerly under FlopCounterMode leaves dynamo state that fails a
    # later make_fx of torch.cond (torch 2.13): start from a clean dynamo.
    torch._dynamo.reset()
    return make_fx(fn)(*args)


def runner(kind, fn, example):
    """``fn`` eagerly, as a make_fx graph, or as an exported program's module."""
    if kind == "eager":
        return fn
    if kind == "make_fx":
        return make_fx(fn)(example)
    module = fn if isinstance(fn, torch.nn.Module) else _AsModule(fn)
    return torch.export.export(module, (example,)).module()


class _AsModule(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


# --- a user's mode: a Python `if` -------------------------------------------------------


@pytest.mark.parametrize("kind", ["eager", "make_fx", "export"])
@pytest.mark.parametrize("x", [POS, NEG], ids=["true", "false"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_user_mode_sees_what_a_python_if_shows_it(kind, x, requires_grad):
    run = runner(kind, ours, POS)
    x1, x2 = x.clone().requires_grad_(requires_grad), x.clone().requires_grad_(requires_grad)
    out, ops = logged(run, x1)
    expected, expected_ops = logged(python_if, x2)
    torch.testing.assert_close(out, expected)
    assert ops == expected_ops
    if requires_grad:
        _, backward_ops = logged(lambda: out.sum().backward())
        _, expected_backward_ops = logged(lambda: expected.sum().backward())
        assert backward_ops == expected_backward_ops
        torch.testing.assert_close(x1.grad, x2.grad)


@pytest.mark.parametrize("kind", ["eager", "make_fx", "export"])
@pytest.mark.parametrize("x", [POS, NEG], ids=["true", "false"])
def test_user_mode_with_parameters(kind, x):
    model = Model()
    run = runner(kind, model, POS)
    out, ops = logged(run, x)
    expected, expected_ops = logged(model_python_if, model, x)
    torch.testing.assert_close(out, expected)
    assert ops == expected_ops
    grads = torch.autograd.grad(run(x).sum(), list(model.parameters()), allow_unused=True)
    expected_grads = torch.autograd.grad(
        model_python_if(model, x).sum(), list(model.parameters()), allow_unused=True
    )
    for g, e in zip(grads, expected_grads):
        assert (g is None) == (e is None)
        if g is not None:
            torch.testing.assert_close(g, e)


BRANCHES = [lambda x: x.sin(), lambda x: x @ W, lambda x: x.exp()]


@pytest.mark.parametrize("kind", ["eager", "make_fx"])
@pytest.mark.parametrize("i", [-3, 1, 9])
def test_user_mode_switch(kind, i):
    def program(x, i):
        return switch(i, BRANCHES, (x,))

    index = torch.tensor(i)
    run = program if kind == "eager" else make_fx(program)(POS, torch.tensor(0))
    out, ops = logged(run, POS, index)
    expected, expected_ops = logged(lambda: BRANCHES[min(max(int(index), 0), 2)](POS))
    torch.testing.assert_close(out, expected)
    # Before the index is read: the index made a 0-d int64 and clamped (switch's own
    # selector ops, in the traced graph too); after it: the taken branch's ops alone.
    read = ops.index("aten._local_scalar_dense.default")
    assert set(ops[:read]) <= {"aten.view.default", "aten.clamp.default"}
    assert ops[read:] == expected_ops


@pytest.mark.parametrize("kind", ["eager", "make_fx"])
@pytest.mark.parametrize("x", [POS, NEG, torch.full((3, 4), 0.2)], ids=["mm", "neg", "sin"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_user_mode_nested(kind, x, requires_grad):
    def program(x):
        index = (x.sum() > 5).long()
        inner = lambda x: switch(index, [lambda y: y.sin(), lambda y: y @ W], (x,))  # noqa: E731
        return cond(x.sum() > 0, inner, lambda x: x * 2, (x,))

    def program_if(x):
        index = (x.sum() > 5).long()
        if x.sum() > 0:
            return [lambda y: y.sin(), lambda y: y @ W][int(index)](x)
        return x * 2

    run = runner(kind, program, POS)
    x1, x2 = x.clone().requires_grad_(requires_grad), x.clone().requires_grad_(requires_grad)
    out, ops = logged(run, x1)
    expected, expected_ops = logged(program_if, x2)
    torch.testing.assert_close(out, expected)
    # The inner switch's index is made 0-d and clamped before it is read: nothing else.
    selector_ops = ("aten.view.default", "aten.clamp.default")
    assert [op for op in ops if op not in selector_ops] == expected_ops
    if requires_grad:
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(x1.grad, x2.grad)


def test_user_mode_runs_only_the_taken_branch():
    calls = []

    def t(x):
        calls.append("t")
        return x.add_(1)

    def f(x):
        calls.append("f")
        return x.sub_(1)

    x = torch.zeros(3)
    with Log() as mode:
        out = cond(torch.tensor(True), t, f, (x,))
    assert calls == ["t"] and out is x  # a Python `if`: in place, the operand itself
    torch.testing.assert_close(x, torch.ones(3))
    assert "aten.sub_.Tensor" not in mode.ops and "aten.add_.Tensor" in mode.ops


def test_user_modes_stacked():
    with Log() as outer, Log() as inner:
        ours(NEG)
    _, expected = logged(python_if, NEG)
    assert outer.ops == inner.ops == expected


# --- selectors a user's mode cannot read: the conditional runs beneath it --------------


def test_user_mode_meta_selector():
    x = torch.ones(3, 4, device="meta")
    with Log() as mode:
        out = cond(x.sum() > 0, lambda x: x.sin(), lambda x: x * 2, (x,))
    assert out.device.type == "meta" and out.shape == (3, 4)
    assert mode.ops == ["aten.sum.default", "aten.gt.Scalar"]  # no branch op
    with Log(), pytest.raises(CondArgumentError, match="selector is a meta tensor"):
        cond(x.sum() > 0, lambda x: x.sin(), lambda x: x * 2, (POS,))


def test_user_mode_over_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        x = torch.ones(3, 4)
        with Log():
            out = cond(x.sum() > 0, lambda x: x.sin(), lambda x: x * 2, (x,))
    assert isinstance(out, FakeTensor) and out.shape == (3, 4)


@pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])
@pytest.mark.parametrize("where", ["inside", "around"])
def test_user_mode_and_make_fx_keep_every_branch(tracing_mode, where):
    """A user's mode active while make_fx traces (entered by the traced code or around
    the trace) leaves the conditional to the tracer: one node, every branch."""

    def program(x):
        if where == "inside":
            with Log():
                return ours(x)
        return ours(x)

    trace = make_fx(program, tracing_mode=tracing_mode, _allow_non_fake_inputs=True)
    if where == "around":
        with Log():
            gm = trace(POS)
    else:
        gm = trace(POS)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.higher_order.torchcond_cond) == 1
    for x in (POS, NEG):
        torch.testing.assert_close(gm(x), python_if(x))


def test_user_mode_around_export():
    model = Model()
    with Log():
        ep = torch.export.export(model, (POS,))
    assert any(n.target is torch.ops.higher_order.torchcond_cond for n in ep.graph.nodes)
    for x in (POS, NEG):
        torch.testing.assert_close(ep.module()(x), model_python_if(model, x))


def test_user_mode_under_torch_func():
    expected = torch.func.grad(lambda x: python_if(x).sum())(POS)
    with Log() as mode:
        grad = torch.func.grad(lambda x: ours(x).sum())(POS)
    torch.testing.assert_close(grad, expected)
    assert "aten.mul.Tensor" not in mode.ops  # the untaken branch's x * 2
    batch = torch.stack([POS, NEG])
    with Log():
        out = torch.vmap(ours)(batch)
    torch.testing.assert_close(out, torch.stack([python_if(POS), python_if(NEG)]))


@pytest.mark.parametrize("x", [POS, NEG], ids=["true", "false"])
def test_user_mode_under_torch_func_with_branches_closing_over_the_input(x):
    # The taken branch runs at the transform's level, where x is differentiated (it
    # once ran below it, and the gradient came back zero).
    def f(x):
        return cond(x.sum() > 0, lambda: (x @ W).sin().sum(), lambda: (x * x).sum(), ())

    def f_if(x):
        return (x @ W).sin().sum() if x.sum() > 0 else (x * x).sum()

    with Log() as mode:
        grad = torch.func.grad(f)(x)
    torch.testing.assert_close(grad, torch.func.grad(f_if)(x))
    assert ("aten.sin.default" in mode.ops) == (x is POS)  # only the taken branch ran


# --- modes that take higher-order operators -----------------------------------------


@pytest.mark.parametrize("kind", ["eager", "make_fx"])
def test_mode_taking_hops_gets_the_operator_once(kind):
    run = runner(kind, ours, POS)
    x = NEG.clone().requires_grad_()
    with TakesHops() as mode:
        out = run(x)
    assert mode.ops == ["aten.sum.default", "aten.gt.Scalar", "HOP torchcond_cond"]
    torch.testing.assert_close(out, python_if(NEG))
    out.sum().backward()  # the conditional ran under autograd, as a Python `if`
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))


def test_mode_declining_hops_sees_a_python_if():
    with TakesHops(decline=True) as mode:
        out = ours(NEG)
    _, expected = logged(python_if, NEG)
    assert mode.ops == ["aten.sum.default", "aten.gt.Scalar", "HOP torchcond_cond", *expected[2:]]
    torch.testing.assert_close(out, python_if(NEG))


def _debug_calls(fn, x):
    from torch.utils._debug_mode import DebugMode

    with DebugMode() as mode:
        out = fn(x)
    lines = [line.strip() for line in mode.debug_string().splitlines()]
    return out, [line.split("(")[0] for line in lines if line.startswith(("aten::", "torch."))]


@pytest.mark.parametrize("x", [POS, NEG], ids=["true", "false"])
def test_debug_mode_as_for_torch_cond(x):
    ours_graph, torchs_graph = make_fx(ours)(POS), torch_cond_traced(torchs, POS)
    for run in (ours, ours_graph):
        out, calls = _debug_calls(run, x)
        torch.testing.assert_close(out, python_if(x))
        assert calls == ["aten::sum", "aten::gt.Scalar", "torch.ops.higher_order.torchcond_cond"]
    _, calls = _debug_calls(torchs_graph, x)
    assert calls == ["aten::sum", "aten::gt.Scalar", "torch.ops.higher_order.cond"]


# --- FlopCounterMode ----------------------------------------------------------------------


def flops(fn, *args, backward=False):
    with FlopCounterMode(display=False) as counter:
        out = fn(*args)
        if backward:
            out.sum().backward()
    return counter.get_total_flops(), out, counter.get_flop_counts()


def ours_mm_first(x):
    y = x @ W
    return cond(x.sum() > 0, lambda y: (y @ W).relu(), lambda y: (y @ W @ W) * 2, (y,))


def torchs_mm_first(x):
    y = x @ W
    return torch.cond(x.sum() > 0, lambda y: (y @ W).relu(), lambda y: (y @ W @ W) * 2, (y,))


@pytest.mark.parametrize("x", [POS, NEG], ids=["true", "false"])
@pytest.mark.parametrize(
    "program, torch_program",
    [(ours, torchs), (ours_mm_first, torchs_mm_first)],
    ids=["one-mm", "mm-before"],
)
def test_flops_as_torch_cond_counts_a_traced_graph(x, program, torch_program):
    # torch.cond's count: its upper bound over the branches, through torch's code.
    # (With an mm before it, torch's figure adds both branches' mms: its bound keeps
    # the counts of both when the counter already holds the op; so does ours.)
    expected, _, _ = flops(torch_cond_traced(torch_program, POS), x)
    for run in (program, make_fx(program)(POS)):
        total, out, _ = flops(run, x)
        assert total == expected
        torch.testing.assert_close(out, program(x))  # the taken branch's value
    assert expected == (96 if program is ours else 384)


def test_flops_as_torch_cond_counts_eagerly():
    expected, torch_out, _ = flops(torchs, NEG)
    torch._dynamo.reset()
    total, out, _ = flops(ours, NEG)
    assert total == expected == 96  # the untaken branch's mm is in both
    torch.testing.assert_close(out, python_if(NEG))
    # torch 2.11-2.15 return the true branch's output whatever the predicate:
    assert not torch.allclose(torch_out, python_if(NEG))


@pytest.mark.parametrize("kind", ["eager", "make_fx", "export"])
@pytest.mark.parametrize("x", [POS, NEG], ids=["true", "false"])
def test_flops_per_module_as_torch_cond(kind, x):
    model = Model()
    torch_model = Model(use_torch_cond=True)
    torch_model.load_state_dict(model.state_dict())
    if kind == "eager":
        run, torch_run = model, torch_model
    elif kind == "make_fx":
        run, torch_run = make_fx(model)(POS), torch_cond_traced(torch_model, POS)
    else:
        torch._dynamo.reset()
        run = torch.export.export(model, (POS,)).module()
        torch_run = torch.export.export(torch_model, (POS,)).module()
    total, out, counts = flops(run, x)
    if kind != "eager":
        # torch 2.13 fails to count a traced torch.cond over parameters that require
        # grad (FlopCounterMode's module tracker finds no grad_fn in its branches).
        torch_model.requires_grad_(False)
    expected, _, expected_counts = flops(torch_run, x)
    torch._dynamo.reset()
    assert total == expected == 192  # the upper bound: b's two Linear(4, 4) on 3 rows
    torch.testing.assert_close(out, model_python_if(model, x))

    def per_module(counts, name):
        return {key.replace(name, "M"): dict(value) for key, value in counts.items()}

    assert per_module(counts, "Model") == per_module(expected_counts, "Model")
    if kind == "eager":  # modules called in a branch, counted there
        assert counts["Model.b"] == {torch.ops.aten.addmm: 192}


@pytest.mark.parametrize("kind", ["eager", "make_fx"])
@pytest.mark.parametrize("i", [0, 1, 2])
def test_switch_flops_as_nested_torch_cond(kind, i):
    branches = [lambda x: x @ W, lambda x: x @ W @ W, lambda x: x * 2]

    def program(x, i):
        return switch(i, branches, (x,))

    def torch_program(x, i):
        return torch.cond(
            i == 0,
            branches[0],
            lambda x: torch.cond(i == 1, branches[1], branches[2], (x,)),
            (x,),
        )

    index = torch.tensor(i)
    expected, _, _ = flops(torch_cond_traced(torch_program, POS, index), POS, index)
    run = program if kind == "eager" else make_fx(program)(POS, index)
    total, out, _ = flops(run, POS, index)
    assert total == expected == 192
    torch.testing.assert_close(out, branches[i](POS))


@pytest.mark.parametrize("kind", ["eager", "make_fx"])
def test_nested_flops_as_nested_torch_cond(kind):
    def program(x):
        inner = lambda x: cond(x.sum() > 100, lambda y: y @ W, lambda y: y @ W @ W, (x,))  # noqa: E731
        return cond(x.sum() > 0, inner, lambda x: x * 2, (x,))

    def torch_program(x):
        inner = lambda x: torch.cond(x.sum() > 100, lambda y: y @ W, lambda y: y @ W @ W, (x,))  # noqa: E731
        return torch.cond(x.sum() > 0, inner, lambda x: x * 2, (x,))

    expected, _, _ = flops(torch_cond_traced(torch_program, POS), NEG)
    run = program if kind == "eager" else make_fx(program)(POS)
    for x in (POS, NEG):
        total, out, _ = flops(run, x)
        assert total == expected == 192
        torch.testing.assert_close(out, program(x))


def test_flops_untaken_branches_run_on_fake_tensors():
    seen, buffer = [], torch.zeros(3)

    def untaken(x):
        seen.append(type(x).__name__)
        buffer.add_(1)  # a closure written in place: must stay untouched
        return torch.nn.functional.dropout(x @ W, 0.5)

    torch.manual_seed(0)
    total, out, _ = flops(lambda x: cond(torch.tensor(True), lambda x: x * 3, untaken, (x,)), POS)
    after_count = torch.rand(3)
    torch.manual_seed(0)
    expected = torch.rand(3)
    assert total == 96 and seen == ["FakeTensor"]
    torch.testing.assert_close(out, POS * 3)
    torch.testing.assert_close(buffer, torch.zeros(3))
    torch.testing.assert_close(after_count, expected)  # no draw from the real generator


def test_flops_untaken_branch_that_needs_data_warns():
    def needs_data(x):
        return x[x > 0] @ W

    with pytest.warns(UserWarning, match="false_fn did not run on fake tensors"):
        total, out, _ = flops(
            lambda x: cond(torch.tensor(True), lambda x: x @ W, needs_data, (x,)), POS
        )
    assert total == 96
    torch.testing.assert_close(out, POS @ W)


def test_flops_with_backward_count_the_taken_branchs_backward():
    def program(x, w):
        return cond(x.sum() > 0, lambda x, w: x @ w, lambda x, w: (x @ w @ w).relu(), (x, w))

    for x, forward, backward in [(POS, 192, 2 * 96), (NEG, 192, 4 * 96)]:
        args = (x.clone().requires_grad_(), W.clone().requires_grad_())
        total, _, _ = flops(program, *args, backward=True)
        assert total == forward + backward  # the upper bound, then a Python `if`'s backward
        expected = [a.detach().clone().requires_grad_() for a in (x, W)]
        torch.autograd.backward(
            (expected[0] @ expected[1])
            if x.sum() > 0
            else (expected[0] @ expected[1] @ expected[1]).relu(),
            torch.ones(3, 4),
        )
        torch.testing.assert_close(args[0].grad, expected[0].grad)


def test_flops_over_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.ones(3, 4), torch.ones(4, 4)
        total, out, _ = flops(
            lambda x: cond(x.sum() > 0, lambda x: x @ w, lambda x: x @ w @ w, (x,)), x
        )
    assert total == 192 and out.shape == (3, 4)


@pytest.mark.parametrize("kind", ["eager", "make_fx"])
def test_flops_of_a_training_step_over_fake_tensors(kind):
    from torch._subclasses.fake_tensor import FakeTensorMode

    def program(x, w):
        return cond(x.sum() > 0, lambda x, w: (x @ w).relu(), lambda x, w: x @ w @ w, (x, w))

    run = program if kind == "eager" else make_fx(program)(POS, W)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x, w = torch.ones(3, 4, requires_grad=True), torch.ones(4, 4, requires_grad=True)
        forward, out, _ = flops(run, x, w)
        with FlopCounterMode(display=False) as counter:
            out.sum().backward()
    assert forward == 192  # the false branch's two mms
    # The backward is a conditional of the branches' vjps, which recompute their
    # branch: 3 mms for true_fn's, 5 for false_fn's.
    assert counter.get_total_flops() == 5 * 96
    assert w.grad.shape == (4, 4)


def test_flops_with_a_user_mode_beneath():
    """The counter on top counts; the user's mode beneath sees the branch that runs."""
    with Log() as mode, FlopCounterMode(display=False) as counter:
        out = ours(NEG)
    assert counter.get_total_flops() == 96
    _, expected = logged(python_if, NEG)
    assert mode.ops == expected
    torch.testing.assert_close(out, python_if(NEG))


# --- profiler ranges ------------------------------------------------------------------------


def _ranges(fn):
    with torch.profiler.profile() as prof:
        fn()
    return prof, [e.key for e in prof.key_averages() if e.key.startswith("torchcond.")]


@pytest.mark.parametrize("x", [POS, NEG], ids=["true", "false"])
def test_profiler_ranges_cond(x):
    prof, names = _ranges(lambda: ours(x))
    taken = "true_fn" if x.sum() > 0 else "false_fn"
    assert sorted(names) == ["torchcond.cond", f"torchcond.cond/{taken}"]
    (outer,) = [e for e in prof.events() if e.name == "torchcond.cond"]
    (inner,) = [e for e in prof.events() if e.name == f"torchcond.cond/{taken}"]
    assert inner in outer.cpu_children
    branch_ops = {c.name for c in inner.cpu_children}
    assert branch_ops == ({"aten::matmul", "aten::relu"} if taken == "true_fn" else {"aten::mul"})


def test_profiler_ranges_switch_nested():
    def program(x):
        return switch(
            torch.tensor(7),
            [torch.sin, lambda x: cond(x.sum() > 0, torch.cos, torch.exp, (x,))],
            (x,),
        )

    prof, names = _ranges(lambda: program(NEG))
    assert sorted(names) == [
        "torchcond.cond",
        "torchcond.cond/false_fn",
        "torchcond.switch",
        "torchcond.switch/branches[1]",
    ]
    (branch,) = [e for e in prof.events() if e.name == "torchcond.switch/branches[1]"]
    assert "torchcond.cond" in {c.name for c in branch.cpu_children}


def test_profiler_range_under_a_mode():
    with Log():
        _, names = _ranges(lambda: ours(POS))
    assert "torchcond.cond" in names


def test_no_ranges_without_a_profiler(monkeypatch):
    made = []
    real = torch.autograd.profiler.record_function

    def spy(name, *args):
        made.append(name)
        return real(name, *args)

    monkeypatch.setattr(torch.autograd.profiler, "record_function", spy)
    ours(POS)
    switch(torch.tensor(1), BRANCHES, (POS,))
    with Log():
        ours(POS)
    assert made == []
    with torch.profiler.profile():
        ours(POS)
    assert made == ["torchcond.cond", "torchcond.cond/true_fn"]


def test_the_kinds_of_modes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchcond._src import modes
    from torchcond._src.ops import cond_op

    assert modes.kind_of(cond_op, Log()) == modes.USER
    assert modes.kind_of(cond_op, TakesHops()) == modes.TAKES_HOPS
    assert modes.kind_of(cond_op, FakeTensorMode()) is None
    with FlopCounterMode(display=False):
        assert modes.top_kind(cond_op) == modes.COUNTS_FLOPS
