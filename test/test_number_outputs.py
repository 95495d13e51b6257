"""Branches that return Python numbers (int, bool, float, and their Sym kinds), alone or
mixed with tensors (issue 31), in every mode, against the same program written with
a Python ``if``."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torchcond
from torchcond import BranchMismatchError, CondError, UnsupportedCondError

# --- programs: each written once with torchcond and once with a Python `if` ------------


# ``x.select(0, n)``, not ``x[n]``: make_fx (torch alone) cannot index with a SymInt.
def index_program(c):
    return lambda x: x.select(0, c(x.sum() > 0, lambda: 0, lambda: 1, ()))


def size_program(c):
    def f(x):
        n = c(x.sum() > 0, lambda x: x.shape[0] * 2, lambda x: 1, (x,))
        return x.new_zeros(n) + 1

    return f


def narrow_program(c):
    return lambda x: x.narrow(0, 0, c(x.sum() > 0, lambda x: x.shape[0], lambda x: 1, (x,)))


def mixed_program(c):
    def f(x):
        y, n, flag = c(x.sum() > 0, lambda x: (x * 2, 3, True), lambda x: (x - 1, 5, False), (x,))
        return y * n, torch.scalar_tensor(flag, dtype=torch.bool)

    return f


def float_program(c):
    return lambda x: x * c(x.sum() > 0, lambda: 0.5, lambda: 2.0, ())


def dict_program(c):
    def f(x):
        out = c(x.sum() > 0, lambda x: {"y": x + 1, "k": 0}, lambda x: {"y": x, "k": 2}, (x,))
        return out["y"].select(0, out["k"])

    return f


def same_program(c):
    return lambda x: x * c(x.sum() > 0, lambda: 7, lambda: 7, ())


def switch_program(s):
    return lambda x: x.select(
        0, s(x.sum().long().clamp(0, 2), [lambda: 0, lambda: 2, lambda: 1], ())
    )


def python_cond(pred, true_fn, false_fn, operands):
    return true_fn(*operands) if pred else false_fn(*operands)


def python_switch(index, branches, operands):
    return branches[min(max(int(index), 0), len(branches) - 1)](*operands)


COND_PROGRAMS = {
    "index": index_program,
    "size": size_program,
    "narrow": narrow_program,
    "mixed": mixed_program,
    "float": float_program,
    "dict": dict_program,
    "same": same_program,
}
# Sizes that depend on the branch need symbolic shapes.
SIZED = {"size", "narrow"}


def inputs():
    return [torch.arange(1.0, 7.0).reshape(3, 2), -torch.arange(1.0, 7.0).reshape(3, 2)]


def pair(name):
    if name == "switch":
        return switch_program(torchcond.switch), switch_program(python_switch)
    make = COND_PROGRAMS[name]
    return make(torchcond.cond), make(python_cond)


ALL = [*COND_PROGRAMS, "switch"]


def assert_same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), (g, w)


class Module(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


# --- eager: a Python `if` --------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 3, True, 2.5, -(2**40)])
def test_eager_returns_the_taken_value_as_is(value):
    x = torch.ones(2)
    for pred in (True, False, torch.tensor(True), torch.tensor(False)):
        got = torchcond.cond(pred, lambda: value, lambda: value, ())
        assert type(got) is type(value) and got == value
    out = torchcond.cond(torch.tensor(False), lambda x: (x, 1), lambda x: (x + 1, value), (x,))
    assert type(out[1]) is type(value) and out[1] == value


def test_eager_symbolic_predicate_path_restores_python_types():
    # check_branches traces every branch, then the taken one runs as Python.
    out = torchcond.cond(
        torch.tensor(True), lambda: (1, True, 0.5), lambda: (2, False, 1.5), (), check_branches=True
    )
    assert out == (1, True, 0.5) and [type(v) for v in out] == [int, bool, float]


@pytest.mark.parametrize("name", ALL)
def test_eager(name):
    fn, ref = pair(name)
    for x in inputs():
        assert_same(fn(x), ref(x))


# --- traced ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_make_fx_symbolic(name):
    fn, ref = pair(name)
    gm = make_fx(fn, tracing_mode="symbolic")(inputs()[0])
    for x in inputs():
        assert_same(gm(x), ref(x))


@pytest.mark.parametrize("name", [n for n in ALL if n not in SIZED])
def test_make_fx_fake(name):
    # Fake tensors with static shapes still hold a shape env for unbacked symbols.
    fn, ref = pair(name)
    gm = make_fx(fn, tracing_mode="fake")(inputs()[0])
    for x in inputs():
        assert_same(gm(x), ref(x))


def test_make_fx_real():
    fn, ref = pair("same")
    gm = make_fx(fn, tracing_mode="real")(inputs()[0])
    for x in inputs():
        assert_same(gm(x), ref(x))
    fn, _ = pair("index")
    with pytest.raises(
        UnsupportedCondError, match=r"output: branches return different numbers \(0, 1\)"
    ):
        make_fx(fn, tracing_mode="real")(inputs()[0])


def test_same_constant_is_no_symbol():
    seen = []

    def f(x):
        n = torchcond.cond(x.sum() > 0, lambda: 7, lambda: 7, ())
        seen.append(n)
        return x * n

    gm = make_fx(f, tracing_mode="symbolic")(torch.ones(3))
    assert seen == [7] and type(seen[0]) is int
    assert "aten.item" not in gm.code and "_local_scalar_dense" not in gm.code


def test_traced_int_has_the_branches_range():
    seen = []

    def f(x):
        n = torchcond.cond(x.sum() > 0, lambda: 2, lambda: 5, ())
        seen.append(n)
        return x.select(0, n)

    make_fx(f, tracing_mode="symbolic")(torch.ones(6))
    (n,) = seen
    assert isinstance(n, torch.SymInt)
    shape_env = n.node.shape_env
    bound = shape_env.bound_sympy(n.node.expr)
    assert (int(bound.lower), int(bound.upper)) == (2, 5)


def export_round_trip(fn, strict, dynamic):
    x = inputs()[0]
    shapes = ({0: torch.export.Dim("batch")},) if dynamic else None
    ep = torch.export.export(Module(fn), (x,), strict=strict, dynamic_shapes=shapes)
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    buffer.seek(0)
    return ep, torch.export.load(buffer)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
@pytest.mark.parametrize("name", ALL)
def test_export(name, strict, dynamic):
    fn, ref = pair(name)
    ep, loaded = export_round_trip(fn, strict, dynamic)
    batches = [inputs()]
    if dynamic:
        batches.append([torch.arange(1.0, 11.0).reshape(5, 2), -torch.ones(5, 2)])
    for xs in batches:
        for x in xs:
            assert_same(ep.module()(x), ref(x))
            assert_same(loaded.module()(x), ref(x))


def test_issue_reproducer_exports_with_range():
    class M(torch.nn.Module):
        def forward(self, x):
            return x[torchcond.cond(x.sum() > 3, lambda: 0, lambda: 1, ())]

    for strict in (False, True):
        ep = torch.export.export(M(), (torch.randn(3, 3),), strict=strict)
        ranges = [(int(r.lower), int(r.upper)) for r in ep.range_constraints.values()]
        assert (0, 1) in ranges
        for x in (torch.full((3, 3), 2.0), torch.zeros(3, 3)):
            assert torch.equal(ep.module()(x), M()(x))


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("name", ALL)
def test_compile(name, backend):
    fn, ref = pair(name)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=name in SIZED)
    for x in inputs():
        assert_same(compiled(x), ref(x))


# --- branches that disagree ---------------------------------------------------------------

MISMATCHES = {
    "int-tensor": (lambda x: (x, 1), lambda x: (x, x), r"output\[1\].*an int.*a Tensor"),
    "int-float": (lambda x: (x, 1), lambda x: (x, 1.0), r"output\[1\].*an int.*a float"),
    "bool-int": (lambda x: {"k": True}, lambda x: {"k": 1}, r"output\['k'\].*a bool.*an int"),
}


def traced(mode, fn):
    x = torch.ones(3)
    if mode == "fx-symbolic":
        return make_fx(fn, tracing_mode="symbolic")(x)
    if mode in ("export-strict", "export-nonstrict"):
        return torch.export.export(Module(fn), (x,), strict=mode == "export-strict")
    torch._dynamo.reset()
    return torch.compile(fn, backend="eager", fullgraph=True)(x)


@pytest.mark.parametrize("mode", ["fx-symbolic", "export-nonstrict", "export-strict", "compile"])
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_branches_that_disagree_on_kind(case, mode):
    true_fn, false_fn, message = MISMATCHES[case]

    def fn(x):
        return torchcond.cond(x.sum() > 0, true_fn, false_fn, (x,))

    with pytest.raises(CondError, match=message) as info:
        traced(mode, fn)
    assert "BranchMismatchError" in type(info.value).__name__ or isinstance(
        info.value, BranchMismatchError
    )


def test_other_leaves_are_refused_by_name():
    with pytest.raises(BranchMismatchError, match=r"output\[1\] is str"):
        make_fx(
            lambda x: torchcond.cond(x.sum() > 0, lambda x: (x, "a"), lambda x: (x, "b"), (x,)),
            tracing_mode="symbolic",
        )(torch.ones(2))


# --- other rules -----------------------------------------------------------------------


def test_autograd_numbers_have_no_gradient_tensors_keep_theirs():
    def fn(c, x):
        y, n = c(x.sum() > 0, lambda x: (x * 2, 1), lambda x: (x * 3, 2), (x,))
        return (y * n).sum()

    for sign in (1.0, -1.0):
        x = torch.full((3,), sign, requires_grad=True)
        (g,) = torch.autograd.grad(fn(torchcond.cond, x), x)
        (want,) = torch.autograd.grad(fn(python_cond, x), x)
        assert torch.equal(g, want)
        compiled = torch.compile(lambda x: fn(torchcond.cond, x), backend="aot_eager")
        (g,) = torch.autograd.grad(compiled(x), x)
        assert torch.equal(g, want)


def test_vmap_per_example_number_is_a_batched_tensor():
    xs = torch.tensor([[1.0, 2.0], [-1.0, -2.0], [3.0, 0.0]])
    got = torch.vmap(lambda x: torchcond.cond(x.sum() > 0, lambda: 4, lambda: 9, ()))(xs)
    assert torch.equal(got, torch.tensor([4, 9, 4]))
    same = torch.vmap(lambda x: x * torchcond.cond(x.sum() > 0, lambda: 4, lambda: 4, ()))(xs)
    assert torch.equal(same, xs * 4)


def test_select_strategy_number_is_a_0d_tensor():
    for pred, want in ((torch.tensor(True), 1), (torch.tensor(False), 2)):
        got = torchcond.cond(pred, lambda: 1, lambda: 2, (), strategy="select")
        assert isinstance(got, torch.Tensor) and got.dim() == 0 and int(got) == want
        same = torchcond.cond(pred, lambda: 3, lambda: 3, (), strategy="select")
        assert same == 3 and type(same) is int


def test_zeros_of_opposite_sign_are_different_numbers():
    # -0.0 == 0.0 in Python, but 1 / -0.0 is -inf: the taken branch's zero must come back.
    branches = [lambda: -0.0, lambda: 0.0]
    for pred, sign in ((torch.tensor(True), -1.0), (torch.tensor(False), 1.0)):
        got = torchcond.cond(pred, *branches, (), strategy="select")
        assert math.copysign(1.0, float(got)) == sign
        got = torchcond.switch(pred.long() ^ 1, branches, (), strategy="select")
        assert math.copysign(1.0, float(got)) == sign
    got = torch.vmap(lambda p: torchcond.cond(p, *branches, ()))(torch.tensor([True, False]))
    assert torch.equal(torch.copysign(torch.ones(2), got), torch.tensor([-1.0, 1.0]))
    seen = []

    def f(x):
        seen.append(torchcond.cond(x.sum() > 0, *branches, ()))
        return x

    make_fx(f, tracing_mode="symbolic")(torch.ones(3))
    assert not isinstance(seen[0], float)  # a symbol, not the first branch's constant


# --- deployment: lower_to_select, ONNX, AOTInductor --------------------------------------


class Deployed(torch.nn.Module):
    def forward(self, x):
        n = torchcond.cond(x.sum() > 0, lambda: 0, lambda: 2, ())
        scale = torchcond.cond(x.sum() > 0, lambda: 1.5, lambda: 3.0, ())
        return x.select(0, n) * scale


def deployed_inputs():
    x = torch.arange(1.0, 7.0).reshape(3, 2)
    return [x, -x]


def test_lower_to_select():
    from torchcond.passes import lower_to_select

    ep = torch.export.export(Deployed(), (deployed_inputs()[0],))
    lowered = lower_to_select(ep)
    for x in deployed_inputs():
        assert torch.equal(lowered.module()(x), Deployed()(x))


def test_onnx():
    onnxruntime = pytest.importorskip("onnxruntime")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (FutureWarning, DeprecationWarning, UserWarning))
        program = torch.onnx.export(Deployed().eval(), (deployed_inputs()[0],), dynamo=True)
    session = onnxruntime.InferenceSession(
        program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    name = session.get_inputs()[0].name
    for x in deployed_inputs():
        (got,) = session.run(None, {name: x.numpy()})
        assert torch.equal(torch.from_numpy(got), Deployed()(x))


def test_aoti(tmp_path):
    ep = torch.export.export(Deployed(), (deployed_inputs()[0],))
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "m.pt2"))
    loaded = torch._inductor.aoti_load_package(path)
    for x in deployed_inputs():
        assert torch.equal(loaded(x), Deployed()(x))


def test_symbolic_bool_and_float_from_sizes():
    def fn(c):
        def f(x):
            flag, half = c(
                x.sum() > 0,
                lambda x: (x.shape[0] > 3, x.shape[0] / 2),
                lambda x: (False, 1.0),
                (x,),
            )
            return x * half + torch.scalar_tensor(flag, dtype=torch.float32)

        return f

    shapes = ({0: torch.export.Dim("batch")},)
    for strict in (False, True):
        ep = torch.export.export(
            Module(fn(torchcond.cond)), (torch.ones(5, 2),), strict=strict, dynamic_shapes=shapes
        )
        for x in (torch.ones(5, 2), -torch.ones(5, 2), torch.ones(3, 2), torch.ones(7, 2)):
            assert torch.equal(ep.module()(x), fn(python_cond)(x))


def test_modes_that_trace_nothing_see_a_python_if():
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.ones(3)
    for make_mode in (PassThrough, lambda: FlopCounterMode(display=False)):
        for sign, want in ((1, 1), (-1, 2)):
            with make_mode():
                _, n = torchcond.cond(
                    (sign * x).sum() > 0, lambda x: (x, 1), lambda x: (x, 2), (x,)
                )
            assert type(n) is int and n == want


def test_meta_tensors_keep_an_agreed_number_and_refuse_a_differing_one():
    m = torch.empty(3, device="meta")
    pred = torch.empty((), dtype=torch.bool, device="meta")
    assert torchcond.cond(pred, lambda x: (x, 1), lambda x: (x + 1, 1), (m,))[1] == 1
    with pytest.raises(UnsupportedCondError, match=r"output\[1\]: branches return different"):
        torchcond.cond(pred, lambda x: (x, 1), lambda x: (x, 2), (m,))
