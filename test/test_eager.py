"""Eager semantics: cond and switch are a Python `if` / index on real tensors."""

import pytest
import torch
import torch.utils._pytree as pytree

import torchcond
from torchcond import cond, switch


def test_takes_the_true_branch_only():
    calls = []

    def t(x):
        calls.append("t")
        return x + 1

    def f(x):
        calls.append("f")
        return x - 1

    x = torch.ones(3)
    torch.testing.assert_close(cond(torch.tensor(True), t, f, (x,)), x + 1)
    torch.testing.assert_close(cond(torch.tensor(False), t, f, (x,)), x - 1)
    assert calls == ["t", "f"]


@pytest.mark.parametrize(
    "pred, expected",
    [
        (torch.tensor(3), True),
        (torch.tensor(0), False),
        (torch.tensor([0.5]), True),
        (torch.tensor([[0.0]]), False),
        (torch.tensor(-1, dtype=torch.int8), True),
        (True, True),
        (0, False),
        (2.5, True),
    ],
)
def test_predicate_truthiness(pred, expected):
    out = cond(pred, lambda: torch.tensor(1), lambda: torch.tensor(0), ())
    assert bool(out) is expected


def test_pytree_operands_and_outputs():
    ops = ({"a": torch.ones(2), "b": [torch.zeros(3)]}, (torch.full((1,), 2.0),))

    def t(d, tup):
        return {"s": d["a"] * tup[0], "rest": [d["b"][0] + 1]}

    def f(d, tup):
        return {"s": d["a"] - tup[0], "rest": [d["b"][0]]}

    out = cond(torch.tensor(True), t, f, ops)
    assert pytree.tree_structure(out) == pytree.tree_structure(t(*ops))
    torch.testing.assert_close(out, t(*ops))


def test_identity_branch_returns_operand_eagerly():
    x = torch.randn(3)
    assert cond(torch.tensor(True), lambda x: x, lambda x: x + 1, (x,)) is x


def test_branches_close_over_tensors_and_parameters():
    lin = torch.nn.Linear(3, 3)
    bias = torch.randn(3)
    x = torch.randn(2, 3)
    out = cond(x.sum() > -100, lambda x: lin(x) + bias, lambda x: x, (x,))
    torch.testing.assert_close(out, lin(x) + bias)


def test_eager_mutation_behaves_like_python_if():
    x = torch.zeros(2)

    def t(x):
        x.add_(1)
        return x * 2

    out = cond(torch.tensor(True), t, lambda x: x, (x,))
    torch.testing.assert_close(x, torch.ones(2))
    torch.testing.assert_close(out, torch.full((2,), 2.0))


@pytest.mark.parametrize("index, taken", [(0, 0), (1, 1), (2, 2), (-5, 0), (7, 2)])
@pytest.mark.parametrize("as_tensor", [True, False])
def test_switch_clamps_the_index(index, taken, as_tensor):
    branches = [lambda x, k=k: x + k for k in range(3)]
    x = torch.zeros(2)
    idx = torch.tensor(index) if as_tensor else index
    torch.testing.assert_close(switch(idx, branches, (x,)), x + taken)


def test_switch_single_branch_and_tuple_of_branches():
    x = torch.ones(2)
    torch.testing.assert_close(switch(torch.tensor(4), (lambda x: x * 3,), (x,)), x * 3)


def test_eager_autograd_first_and_second_order():
    x = torch.tensor([0.3, -0.7], dtype=torch.float64, requires_grad=True)

    def f(x):
        return cond(x.sum() > 0, lambda x: (x**3).sum(), lambda x: (x.sin() ** 2).sum(), (x,))

    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    expected = (x.sin() ** 2).sum()
    (eg,) = torch.autograd.grad(expected, x, create_graph=True)
    (egg,) = torch.autograd.grad(eg.sum(), x)
    torch.testing.assert_close(g, eg)
    torch.testing.assert_close(gg, egg)
    torch.autograd.gradcheck(f, (x,))
    torch.autograd.gradgradcheck(f, (x,))


def test_torch_func_transforms_over_a_concrete_predicate():
    def f(x):
        return cond(x.sum() > 0, lambda x: (x**2).sum(), lambda x: x.sum() * 3, (x,))

    x = torch.tensor([1.0, 2.0])
    torch.testing.assert_close(torch.func.grad(f)(x), 2 * x)
    torch.testing.assert_close(torch.func.grad(f)(-x), torch.full((2,), 3.0))
    _, tangent = torch.func.jvp(f, (x,), (torch.ones(2),))
    torch.testing.assert_close(tangent, (2 * x).sum())


def test_vmap_with_unbatched_predicate_vmaps_the_taken_branch():
    xs = torch.randn(4, 3)
    pred = torch.tensor(True)
    out = torch.vmap(lambda x: cond(pred, lambda x: x.cos(), lambda x: x.sin(), (x,)))(xs)
    torch.testing.assert_close(out, xs.cos())


def test_meta_tensors_merge_branches():
    x = torch.empty(4, 3, device="meta")
    out = cond(
        torch.empty((), dtype=torch.bool, device="meta"), lambda x: x + 1, lambda x: x * 2, (x,)
    )
    assert out.device.type == "meta" and out.shape == (4, 3)


def test_fake_tensors_merge_branches():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 3)
        out = cond(x.sum() > 0, lambda x: x + 1, lambda x: x.double().float(), (x,))
    assert out.shape == (4, 3) and out.dtype == torch.float32


def test_numpy_scalars_as_predicate_and_index():
    np = pytest.importorskip("numpy")
    x = torch.ones(2)
    torch.testing.assert_close(cond(np.bool_(False), lambda x: x + 1, lambda x: x - 1, (x,)), x - 1)
    torch.testing.assert_close(switch(np.int64(1), [lambda x: x, lambda x: x * 3], (x,)), x * 3)


def test_a_torch_function_mode_takes_the_checked_path_and_stays_a_python_if():
    calls = []

    def branch(tag):
        return lambda a: calls.append(tag) or a + 1

    with torch.device("cpu"):  # a TorchFunctionMode: not tracing, still eager
        out = cond(torch.tensor(True), branch("t"), branch("f"), (torch.zeros(2),))
        switch(torch.tensor(1), [branch(0), branch(1)], (torch.zeros(2),))
    assert calls == ["t", 1] and torch.equal(out, torch.ones(2))


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda x: cond(torch.tensor(1j), torch.sin, torch.cos, (x,)), "real or bool dtype"),
        (lambda x: cond(torch.ones(2) > 0, torch.sin, torch.cos, (x,)), "exactly one element"),
        (lambda x: cond(torch.tensor(True), "sin", torch.cos, (x,)), "must be callable"),
        (lambda x: switch(torch.tensor(True), [torch.sin], (x,)), "integer dtype"),
        (lambda x: switch(torch.tensor(0.0), [torch.sin], (x,)), "integer dtype"),
        (lambda x: switch(torch.tensor([0, 1]), [torch.sin], (x,)), "exactly one element"),
        (lambda x: switch(torch.tensor(0), [], (x,)), "at least one callable"),
        (lambda x: cond(torch.tensor(True), torch.sin, torch.cos, x), "tuple or list"),
    ],
)
def test_what_the_fast_path_does_not_take_is_refused_by_name(call, error):
    # The eager fast path (one C call) sends every call it cannot check to the slow
    # path, which says what is wrong.
    with pytest.raises(torchcond.CondArgumentError, match=error):
        call(torch.ones(2))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_a_jit_trace_warns_as_it_does_for_a_python_if():
    def f(x):
        return cond(x.sum() > 0, torch.sin, torch.cos, (x,))

    with pytest.warns(torch.jit.TracerWarning, match="Python boolean"):
        torch.jit.trace(f, torch.ones(2))


def test_parameters_and_subclasses_get_what_a_python_if_gives():
    class Marked(torch.Tensor):
        pass

    p = torch.nn.Parameter(torch.ones(2))
    m = torch.ones(2).as_subclass(Marked)
    assert torch.equal(cond(torch.tensor(True), lambda a: a * 2, torch.sin, (p,)), p * 2)
    assert cond(torch.tensor(False).as_subclass(Marked), torch.sin, lambda a: a, (m,)) is m
    assert switch(torch.tensor(5), [torch.sin, lambda a: a], [m]) is m


def _switch_modes():
    from torch.fx.experimental.proxy_tensor import make_fx

    branches = [lambda x, k=k: x + 10 * k for k in range(3)]

    def run(i, x, strategy="auto"):
        return switch(i, branches, (x,), strategy=strategy)

    def export(i, x):
        class M(torch.nn.Module):
            def forward(self, i, x):
                return run(i, x)

        return torch.export.export(M(), (torch.tensor(0, dtype=i.dtype), x)).module()(i, x)

    return {
        "eager": run,
        "select": lambda i, x: run(i, x, "select"),
        "make_fx": lambda i, x: make_fx(lambda i, x: run(i, x))(i, x)(i, x),
        "make_fx fake": lambda i, x: make_fx(lambda i, x: run(i, x), tracing_mode="fake")(i, x)(
            i, x
        ),
        "make_fx select": lambda i, x: make_fx(lambda i, x: run(i, x, "select"))(i, x)(i, x),
        "vmap": lambda i, x: torch.vmap(run)(i.expand(2).clone(), x.expand(2, -1))[0],
        "export": export,
        "select_n": lambda i, x: torchcond.select_n(i, [[b(x)] for b in branches])[0],
    }


@pytest.mark.parametrize("mode", list(_switch_modes()))
@pytest.mark.parametrize(
    "value, taken", [(2**63, 2), (2**64 - 1, 2), (2**63 - 1, 2), (1, 1), (0, 0)]
)
def test_uint64_index_clamps_like_its_value_in_every_mode(mode, value, taken):
    # A uint64 index at or above 2**63 is a large number: the last branch, never a
    # wrapped negative int64 that would take branch 0.
    x = torch.arange(3.0)
    out = _switch_modes()[mode](torch.tensor(value, dtype=torch.uint64), x)
    torch.testing.assert_close(out, x + 10 * taken)
