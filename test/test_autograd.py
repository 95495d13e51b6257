"""Differentiation of cond/switch: eager (a Python `if`), torch.func, and traced graphs."""

import contextlib
import functools
import sys

import expecttest
import pytest
import torch
from helpers import TimesThree, count_nodes, readable
from torch.autograd import gradcheck, gradgradcheck
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

import torchcond
import torchcond._src.autograd
from torchcond import cond, switch

POS = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
NEG = torch.tensor([-0.5, -1.0, 0.3], dtype=torch.float64)


def leaf(t):
    return t.clone().requires_grad_()


def grads(outputs, inputs, **kw):
    return torch.autograd.grad(outputs, inputs, allow_unused=True, **kw)


def assert_grads_equal(got, want):
    """Traced graphs return zeros where eager returns None (an input the branch did not use)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w)


# --- pytree program used across the file -----------------------------------------------


def pytree_cond(x, y):
    """Pytree operands and outputs; each branch reads a different subset."""
    return cond(
        x.sum() > 0,
        lambda ops: {"p": ops["x"].sin() * ops["y"][0], "q": [ops["x"] ** 3]},
        lambda ops: {"p": ops["y"][0].exp(), "q": [ops["x"].cos()]},
        ({"x": x, "y": [y]},),
    )


def pytree_if(x, y):
    if x.sum() > 0:
        return {"p": x.sin() * y, "q": [x**3]}
    return {"p": y.exp(), "q": [x.cos()]}


def flat_out(fn):
    return lambda *a: tuple(torch.utils._pytree.tree_leaves(fn(*a)))


# --- eager ---------------------------------------------------------------------------


@pytest.mark.parametrize("x", [POS, NEG], ids=["true", "false"])
def test_gradcheck_and_gradgradcheck_cond_pytrees(x):
    y = torch.tensor([0.3, -0.7, 1.1], dtype=torch.float64)
    f = flat_out(pytree_cond)
    assert gradcheck(f, (leaf(x), leaf(y)))
    assert gradgradcheck(f, (leaf(x), leaf(y)))


@pytest.mark.parametrize("index", [0, 1, 2, 7])
def test_gradcheck_and_gradgradcheck_switch(index):
    branches = [
        lambda a, b: (a.sin() * b, {"s": (a * b).sum()}),
        lambda a, b: (a.exp(), {"s": b.tanh().sum()}),
        lambda a, b: (a * a * b, {"s": a.sum()}),
    ]

    def f(a, b):
        out, d = switch(torch.tensor(index), branches, (a, b))
        return out, d["s"]

    args = (leaf(POS), leaf(NEG))
    assert gradcheck(f, args)
    assert gradgradcheck(f, args)


def test_mixed_requires_grad_and_one_tensor_passed_twice():
    x, c = leaf(POS), POS.clone()

    def f(x, c):
        return cond(x.sum() > 0, lambda a, b, k: a * b + k, lambda a, b, k: a - b, (x, x, c))

    (g,) = grads(f(x, c).sum(), x)
    torch.testing.assert_close(g, 2 * POS)  # d(x*x)/dx: both uses reach x
    assert f(x, c).grad_fn is not None and not c.requires_grad


def test_gradients_reach_closed_over_parameters_and_not_the_other_branch():
    lin_a, lin_b = torch.nn.Linear(3, 2).double(), torch.nn.Linear(3, 2).double()
    x = leaf(POS)
    out = cond(x.sum() > 0, lambda t: lin_a(t), lambda t: lin_b(t), (x,))
    ga = grads(out.sum(), [x, *lin_a.parameters(), *lin_b.parameters()])
    want = grads(lin_a(x).sum(), [x, *lin_a.parameters()])
    for g, w in zip(ga[:3], want):
        torch.testing.assert_close(g, w)
    assert ga[3:] == (None, None)  # Python-`if` semantics: the untaken branch's params get None


def test_unused_operand_gets_none_in_eager():
    x, y = leaf(POS), leaf(NEG)
    out = cond(x.sum() > 0, lambda a, b: a * 2, lambda a, b: b * 3, (x, y))
    assert grads(out.sum(), [x, y])[1] is None


TRANSFORMS = {
    "grad": lambda f, x: torch.func.grad(lambda t: f(t).sum())(x),
    "vjp": lambda f, x: torch.func.vjp(f, x)[1](torch.ones_like(x))[0],
    "jvp": lambda f, x: torch.func.jvp(f, (x,), (torch.ones_like(x),))[1],
    "jacrev": lambda f, x: torch.func.jacrev(f)(x),
    "jacfwd": lambda f, x: torch.func.jacfwd(f)(x),
    "hessian": lambda f, x: torch.func.hessian(lambda t: f(t).sum())(x),
}


def with_cond(x):
    return cond(x.sum() > 0, lambda a: a.sin() * a**2, lambda a: a.exp() * a, (x,))


def with_if(x):
    return x.sin() * x**2 if x.sum() > 0 else x.exp() * x


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("x", [POS, NEG], ids=["true", "false"])
def test_torch_func_equals_python_if(transform, x):
    apply = TRANSFORMS[transform]
    torch.testing.assert_close(apply(with_cond, x), apply(with_if, x))


def test_checkpoint_around_a_module_with_cond():
    from torch.utils.checkpoint import checkpoint

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 3).double(), torch.nn.Linear(3, 3).double()

        def forward(self, x):
            return cond(x.sum() > 0, lambda t: self.a(t).tanh(), lambda t: self.b(t).relu(), (x,))

    m = M()
    for x in (POS, NEG):
        x1, x2 = leaf(x), leaf(x)
        g1 = grads(checkpoint(m, x1, use_reentrant=False).sum(), [x1, *m.parameters()])
        g2 = grads(m(x2).sum(), [x2, *m.parameters()])
        for a, b in zip(g1, g2):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b)


# --- traced: the backward of a cond is a cond -----------------------------------------------


def symbolic(fn, *args):
    return make_fx(fn, tracing_mode="symbolic")(*args)


def train_step(x, y):
    out = cond(x.sum() > 0, lambda a, b: a.sin() * b, lambda a, b: a.cos() + b, (x, y))
    return (out, *torch.autograd.grad(out.sum(), (x, y)))


class TestTracedGraphs(expecttest.TestCase):
    def test_forward_and_backward_graph_shows_the_backward_cond(self):
        gm = symbolic(train_step, leaf(POS.float()), leaf(NEG.float()))
        self.assertExpectedInline(
            readable(gm),
            """\
class train_step(torch.nn.Module):
    def forward(self, x_1: "f32[s75]", y_1: "f32[s75]"):
        sum_1: "f32[]" = torch.ops.aten.sum.default(x_1)
        gt: "b8[]" = torch.ops.aten.gt.Scalar(sum_1, 0);  sum_1 = None
        true_graph_0 = self.true_graph_0
        false_graph_0 = self.false_graph_0
        torchcond_cond = torch.ops.higher_order.torchcond_cond(gt, true_graph_0, false_graph_0, (x_1, y_1));  true_graph_0 = false_graph_0 = None
        getitem: "f32[s75]" = torchcond_cond[0];  torchcond_cond = None
        sum_2: "f32[]" = torch.ops.aten.sum.default(getitem)
        ones_like: "f32[]" = torch.ops.aten.ones_like.default(sum_2, pin_memory = False, memory_format = torch.preserve_format);  sum_2 = None
        sym_size_int: "Sym(s75)" = torch.ops.aten.sym_size.int(x_1, 0)
        expand: "f32[s75]" = torch.ops.aten.expand.default(ones_like, [sym_size_int]);  ones_like = sym_size_int = None
        true_graph_1 = self.true_graph_1
        false_graph_1 = self.false_graph_1
        torchcond_cond_1 = torch.ops.higher_order.torchcond_cond(gt, true_graph_1, false_graph_1, (x_1, y_1, expand));  gt = true_graph_1 = false_graph_1 = x_1 = y_1 = expand = None
        getitem_1: "f32[s75]" = torchcond_cond_1[0]
        getitem_2: "f32[s75]" = torchcond_cond_1[1];  torchcond_cond_1 = None
        return (getitem, getitem_1, getitem_2)
    class true_graph_0(torch.nn.Module):
        def forward(self, arg0_1: "f32[s75]", arg1_1: "f32[s75]"):
            sin: "f32[s75]" = torch.ops.aten.sin.default(arg0_1);  arg0_1 = None
            mul: "f32[s75]" = torch.ops.aten.mul.Tensor(sin, arg1_1);  sin = arg1_1 = None
            return (mul,)
    class false_graph_0(torch.nn.Module):
        def forward(self, arg0_1: "f32[s75]", arg1_1: "f32[s75]"):
            cos: "f32[s75]" = torch.ops.aten.cos.default(arg0_1);  arg0_1 = None
            add: "f32[s75]" = torch.ops.aten.add.Tensor(cos, arg1_1);  cos = arg1_1 = None
            return (add,)
    class true_graph_1(torch.nn.Module):
        def forward(self, arg0_1: "f32[s75]", arg1_1: "f32[s75]", arg2_1: "f32[s75]"):
            sin: "f32[s75]" = torch.ops.aten.sin.default(arg0_1)
            mul: "f32[s75]" = torch.ops.aten.mul.Tensor(arg2_1, sin);  sin = None
            mul_1: "f32[s75]" = torch.ops.aten.mul.Tensor(arg2_1, arg1_1);  arg2_1 = arg1_1 = None
            cos: "f32[s75]" = torch.ops.aten.cos.default(arg0_1);  arg0_1 = None
            mul_2: "f32[s75]" = torch.ops.aten.mul.Tensor(mul_1, cos);  mul_1 = cos = None
            return (mul_2, mul)
    class false_graph_1(torch.nn.Module):
        def forward(self, arg0_1: "f32[s75]", arg1_1: "f32[s75]", arg2_1: "f32[s75]"):
            sin: "f32[s75]" = torch.ops.aten.sin.default(arg0_1);  arg0_1 = None
            neg: "f32[s75]" = torch.ops.aten.neg.default(sin);  sin = None
            mul: "f32[s75]" = torch.ops.aten.mul.Tensor(arg2_1, neg);  neg = None
            clone_default: "f32[s75]" = torch.ops.aten.clone.default(arg2_1);  arg2_1 = None
            return (mul, clone_default)
""",
        )


def test_traced_forward_and_backward_match_eager_on_both_branches():
    gm = symbolic(train_step, leaf(POS), leaf(NEG))
    assert count_nodes(gm, "torchcond_cond") == 2
    for x in (POS, NEG, -2 * POS):
        y = torch.randn(x.shape, dtype=x.dtype)
        assert_grads_equal(gm(leaf(x), leaf(y)), train_step(leaf(x), leaf(y)))


def test_second_derivative_traces_to_a_graph_of_conds():
    def f(x):
        return cond(x.sum() > 0, lambda a: a.exp() * a.sin(), lambda a: a**3, (x,))

    def second(x):
        (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), x, create_graph=True)
        return g, gg, torch.autograd.grad(gg.sum(), x)[0]

    gm = symbolic(second, leaf(POS))
    # forward, backward, backward of backward, and the third derivative: all conds
    assert count_nodes(gm, "torchcond_cond") == 4
    for x in (POS, NEG):
        assert_grads_equal(gm(leaf(x)), second(leaf(x)))


def test_switch_backward_is_a_switch_on_the_same_index():
    branches = [lambda a: a.sin(), lambda a: a * a, lambda a: a.exp()]

    def step(i, x):
        (g,) = torch.autograd.grad(switch(i, branches, (x,)).sum(), x, create_graph=True)
        return g, torch.autograd.grad(g.sum(), x)[0]

    gm = symbolic(step, torch.tensor(0), leaf(POS))
    switches = [
        n for n in gm.graph.nodes if getattr(n.target, "__name__", "") == "torchcond_switch"
    ]
    assert len(switches) == 3 and len({n.args[0] for n in switches}) == 1
    for i in range(-1, 4):
        assert_grads_equal(gm(torch.tensor(i), leaf(POS)), step(torch.tensor(i), leaf(POS)))


def test_a_branch_stop_gradient_survives_into_the_second_derivative():
    def second(x):
        out = cond(x.sum() > 0, lambda a: a.detach() * a**2, lambda a: a**3, (x,))
        (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        return g, torch.autograd.grad(g.sum(), x)[0]

    gm = symbolic(second, leaf(POS))
    for x in (POS, NEG):
        assert_grads_equal(gm(leaf(x)), second(leaf(x)))


def test_backward_keeps_only_the_primals_it_reads():
    def step(x, y):
        out = cond(x.sum() > 0, lambda a, b: a * 2 + b, lambda a, b: a * 3 - b, (x, y))
        return torch.autograd.grad(out.sum(), (x, y))

    gm = symbolic(step, leaf(POS), leaf(NEG))
    backward = [n for n in gm.graph.nodes if getattr(n.target, "__name__", "") == "torchcond_cond"][
        1
    ]
    operand_names = [a.name for a in backward.args[3]]
    assert operand_names == ["expand"]  # the cotangent only: linear branches need no primal


class TwoHeads(torch.nn.Module):
    """Branches close over the module's parameters (no explicit operands for them)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

    def forward(self, x):
        return cond(x.sum() > 0, lambda t: self.a(t).relu(), lambda t: self.b(t).tanh(), (x,))


def test_gradients_reach_closed_over_parameters_in_a_traced_training_step():
    m = TwoHeads()
    params = dict(m.named_parameters())

    def step(params, x):
        out = torch.func.functional_call(m, params, (x,))
        return torch.autograd.grad(out.sum(), list(params.values()), allow_unused=True)

    gm = make_fx(step, tracing_mode="fake")(params, torch.randn(4, 3))
    for sign in (1.0, -1.0):
        x = sign * torch.rand(4, 3) + sign
        got, want = gm(params, x), step(params, x)
        assert_grads_equal(got, want)
        untaken = [2, 3] if sign > 0 else [0, 1]
        assert all(want[i] is None and not got[i].any() for i in untaken)


class Calls:
    """Counts, from outside, how many times Python runs each of some functions.

    A profile hook counts, so the functions change no state themselves: a traced
    branch may not (torchcond refuses it)."""

    def __init__(self, **fns):
        self._names = {fn.__code__: name for name, fn in fns.items()}
        self.counts = dict.fromkeys(fns, 0)

    def _hook(self, frame, event, arg):
        if event == "call" and frame.f_code in self._names:
            self.counts[self._names[frame.f_code]] += 1

    def __enter__(self):
        sys.setprofile(self._hook)
        return self.counts

    def __exit__(self, *exc):
        sys.setprofile(None)


def branch_graphs(gm: torch.fx.GraphModule) -> set[int]:
    """The distinct branch graphs a traced program holds (one may have several names)."""
    return {id(m) for name, m in gm.named_children() if "_graph_" in name}


def test_derivative_graphs_are_built_once_per_forward_graph(monkeypatch):
    inner = symbolic(lambda x: cond(x.sum() > 0, lambda a: a.sin(), lambda a: a.cos(), (x,)), POS)
    fwd_true, fwd_false = inner.true_graph_0, inner.false_graph_0
    built = []
    real = torchcond._src.autograd._derivative_graph
    monkeypatch.setattr(
        torchcond._src.autograd, "_derivative_graph", lambda *a: built.append(1) or real(*a)
    )

    def unrolled(x0):
        x = x0
        for _ in range(3):  # one cell applied three times, as in a recurrence
            # the operator itself, as compiled and exported programs call it
            (x,) = torchcond.cond_op(x.sum() > 0, fwd_true, fwd_false, (x,))
        return torch.autograd.grad(x.pow(2).sum(), x0)[0]

    gm = make_fx(unrolled, tracing_mode="fake")(leaf(POS))
    assert len(built) == 2  # one vjp graph per branch, reused by all three backward conds
    assert count_nodes(gm, "torchcond_cond") == 6


@pytest.mark.parametrize("transform", ["grad", "jvp", "jacrev", "jacfwd", "hessian"])
def test_torch_func_transforms_trace_into_conds(transform):
    apply = TRANSFORMS[transform]
    gm = symbolic(lambda x: apply(with_cond, x), POS)
    assert count_nodes(gm, "torchcond_cond") >= 2
    for x in (POS, NEG):
        torch.testing.assert_close(gm(x), apply(with_if, x))


def test_forward_mode_ad_traced():
    import torch.autograd.forward_ad as fwAD

    def tangent(x, t):
        with fwAD.dual_level():
            return fwAD.unpack_dual(with_cond(fwAD.make_dual(x, t))).tangent

    gm = symbolic(tangent, POS, torch.ones(3, dtype=torch.float64))
    for x in (POS, NEG):
        t = torch.randn(3, dtype=torch.float64)
        torch.testing.assert_close(gm(x, t), tangent(x, t))


def test_vmap_with_an_unbatched_selector_keeps_one_cond():
    def f(p, x):
        return cond(p, lambda a: a.sin(), lambda a: a * 2, (x,))

    batched = torch.vmap(f, in_dims=(None, 0))
    gm = symbolic(batched, torch.tensor(True), torch.randn(4, 3))
    assert count_nodes(gm, "torchcond_cond") == 1
    xs = torch.randn(4, 3)
    for p in (True, False):
        torch.testing.assert_close(gm(torch.tensor(p), xs), batched(torch.tensor(p), xs))
    # a batched selector: every branch runs, one select per example, no cond node
    per_example = make_fx(torch.vmap(f), tracing_mode="fake")(torch.tensor([True, False]), xs[:2])
    assert count_nodes(per_example, "torchcond_cond") == 0
    ps = torch.tensor([False, True])
    torch.testing.assert_close(per_example(ps, xs[:2]), torch.stack([xs[0] * 2, xs[1].sin()]))


# --- training through export and AOTAutograd -----------------------------------------------


class MLPCond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
        self.b = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))

    def forward(self, x):
        return cond(x.sum() > 0, lambda t: self.a(t), lambda t: self.b(t) * 2, (x,))


def param_grads(module, x):
    return torch.autograd.grad(module(x).pow(2).sum(), list(module.parameters()), allow_unused=True)


def test_export_run_decompositions_then_a_joint_trace_matches_eager():
    model = MLPCond()
    x = torch.randn(5, 3)
    ep = torch.export.export(model, (x,)).run_decompositions()
    exported = ep.module()
    params = dict(exported.named_parameters())

    def joint(params, x):
        out = torch.func.functional_call(exported, params, (x,))
        return (
            out,
            *torch.autograd.grad(out.pow(2).sum(), list(params.values()), allow_unused=True),
        )

    gm = make_fx(joint, tracing_mode="fake")(params, x)
    assert count_nodes(gm, "torchcond_cond") == 2
    for sign in (1.0, -1.0):
        xs = sign * torch.rand(5, 3) + sign
        out, *got = gm(params, xs)
        torch.testing.assert_close(out, model(xs))
        assert_grads_equal(got, param_grads(model, xs))


def test_aot_function_partitions_the_backward_cond():
    from functorch.compile import aot_function, make_boxed_func

    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm)

    def f(x, w):
        return cond(x.sum() > 0, lambda a, b: (a * b).sin(), lambda a, b: a.exp() - b, (x, w))

    compiled = aot_function(f, fw_compiler=keep, bw_compiler=keep)
    for x in (POS, NEG):
        w = torch.randn(3, dtype=torch.float64)
        xa, wa, xb, wb = leaf(x), leaf(w), leaf(x), leaf(w)
        assert_grads_equal(
            grads(compiled(xa, wa).sum(), [xa, wa]), grads(f(xb, wb).sum(), [xb, wb])
        )
    forward, backward = graphs[:2]
    assert count_nodes(forward, "torchcond_cond") == 1
    assert count_nodes(backward, "torchcond_cond") == 1


def test_aot_module_sees_parameters_its_branches_close_over():
    from functorch.compile import aot_module, make_boxed_func

    m = TwoHeads()

    def boxed(gm, _):
        return make_boxed_func(gm)

    compiled = aot_module(m, fw_compiler=boxed, bw_compiler=boxed)
    for sign in (1.0, -1.0):
        x = sign * torch.rand(4, 3) + sign
        got = grads(compiled(x).sum(), list(m.parameters()))
        assert_grads_equal(got, grads(m(x).sum(), list(m.parameters())))


def test_meta_tensors_differentiate_without_a_tracer():
    lin = torch.nn.Linear(3, 2, device="meta")
    x = torch.empty(4, 3, device="meta", requires_grad=True)
    out = cond(x.sum() > 0, lambda t: lin(t), lambda t: t[:, :2] * 2, (x,))
    out.sum().backward()
    assert x.grad.shape == (4, 3) and x.grad.device.type == "meta"
    assert lin.weight.grad.shape == (2, 3)  # a closure, found by running the branches


def _fake_or_meta(where):
    """A context for tensors made where the branches run without a tracer, and their device."""
    if where == "fake":
        return torch._subclasses.fake_tensor.FakeTensorMode(), "cpu"
    return contextlib.nullcontext(), "meta"


@pytest.mark.parametrize("read", ["w", "w.T", "w.mT"])
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("where", ["meta", "fake"])
def test_closures_found_without_a_tracer_get_their_gradients(where, nested, read):
    # A property that returns a tensor (w.T) reads w; a closure that only a nested
    # conditional reads is the outer branch's too, as torch.cond (which compiles
    # itself) finds it.
    context, device = _fake_or_meta(where)
    with context:
        w = torch.ones(3, 3, device=device, requires_grad=True)
        x = torch.ones(2, 3, device=device)
        weight = {"w": lambda: w, "w.T": lambda: w.T, "w.mT": lambda: w.mT}[read]

        def inner(x):
            return x @ weight()

        def outer(x):
            return cond(x.sum() > 0, inner, lambda x: x - 1, (x,)) if nested else inner(x)

        cond(x.sum() > 0, outer, lambda x: x + 1, (x,)).sum().backward()
        assert w.grad is not None and w.grad.shape == (3, 3)


@pytest.mark.parametrize("where", ["meta", "fake"])
def test_torch_cond_in_a_branch_differentiated_without_a_tracer_is_refused(where):
    # Closures are found by reading them through a torch-function mode, which code that
    # torch.compile traces does not show its tensors to.
    context, device = _fake_or_meta(where)
    with context:
        w = torch.ones(3, device=device, requires_grad=True)
        x = torch.ones(3, device=device)

        def outer(x):
            return torch.cond(x.sum() > 0, lambda x: x * w, lambda x: x - w, (x,))

        with pytest.raises(torchcond.UnsupportedCondError, match="without a tracer"):
            cond(x.sum() > 0, outer, lambda x: x + 1, (x,)).sum().backward()


def test_checkpoint_around_a_cond_traces_and_matches_eager():
    from torch.utils.checkpoint import checkpoint

    m = TwoHeads()

    def step(x):
        out = checkpoint(m, x, use_reentrant=False)
        return torch.autograd.grad(out.sum(), [x, *m.parameters()], allow_unused=True)

    gm = make_fx(step)(torch.randn(2, 3, requires_grad=True))
    assert count_nodes(gm, "torchcond_cond") >= 2
    for sign in (1.0, -1.0):
        x = (sign * torch.ones(2, 3)).requires_grad_()
        assert_grads_equal(gm(x), step(x))


# --- derivatives come from the branch's own autograd (grad mode, custom Functions) ---


def scaled_by_a_constant_sum(a):
    """``a * s`` where ``s`` is read under no_grad: a constant to autograd."""
    with torch.no_grad():
        s = a.sum()
    return a * s + a**2


def rounded(a):
    """``round(a)`` with gradient 3 (TimesThree's backward), not round's zero."""
    return TimesThree.apply(a)


def grad_of_cond(branch):
    def step(x):
        out = cond(x.sum() > 0, branch, lambda a: a.sin(), (x,))
        return torch.autograd.grad(out.sum(), x)

    return step


def grad_of_if(branch):
    def step(x):
        out = branch(x) if x.sum() > 0 else x.sin()
        return torch.autograd.grad(out.sum(), x)

    return step


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_traced_gradients_treat_a_no_grad_block_as_a_constant(mode):
    gm = make_fx(grad_of_cond(scaled_by_a_constant_sum), tracing_mode=mode)(leaf(POS))
    for x in (POS, NEG):
        assert_grads_equal(gm(leaf(x)), grad_of_if(scaled_by_a_constant_sum)(leaf(x)))


def test_aot_function_gradients_treat_a_no_grad_block_as_a_constant():
    from functorch.compile import aot_function, make_boxed_func

    def f(x):
        return cond(x.sum() > 0, scaled_by_a_constant_sum, lambda a: a.sin(), (x,))

    compiled = aot_function(f, fw_compiler=lambda gm, _: make_boxed_func(gm))
    for x in (POS, NEG):
        xa, xb = leaf(x), leaf(x)
        want = grads(scaled_by_a_constant_sum(xb).sum() if x.sum() > 0 else xb.sin().sum(), [xb])
        assert_grads_equal(grads(compiled(xa).sum(), [xa]), want)


def test_a_no_grad_block_stays_constant_in_the_traced_second_derivative():
    def second(x):
        out = cond(x.sum() > 0, scaled_by_a_constant_sum, lambda a: a**3, (x,))
        (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        return g, torch.autograd.grad(g.sum(), x)[0]

    gm = symbolic(second, leaf(POS))
    for x in (POS, NEG):
        assert_grads_equal(gm(leaf(x)), second(leaf(x)))


class Square(torch.autograd.Function):
    """``x * x`` whose backward reads its saved input: a second derivative goes through it."""

    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def assert_traced_matches_eager(fn, *args, modes=("real", "fake", "symbolic")):
    """``fn`` traced in each mode gives what it gives eagerly, on the same arguments."""

    def fresh():
        return [leaf(a) if a.is_floating_point() else a for a in args]

    want = fn(*fresh())
    for mode in modes:
        got = make_fx(fn, tracing_mode=mode)(*fresh())(*fresh())
        assert_grads_equal(got, want)


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_a_traced_gradient_runs_a_custom_functions_own_backward(mode):
    # The Function's backward is in no graph; re-differentiating its forward ops
    # (round: zero) would silently replace it. The derivative is traced from the
    # user's branch instead, where autograd runs the Function's backward.
    gm = make_fx(grad_of_cond(rounded), tracing_mode=mode)(leaf(POS))
    for x in (POS, NEG):
        assert_grads_equal(gm(leaf(x)), grad_of_if(rounded)(leaf(x)))
    assert_grads_equal(gm(leaf(POS)), (torch.full_like(POS, 3.0),))


def test_a_derivative_outside_the_forwards_trace_through_a_custom_function_is_refused():
    # The traced forward holds the Function's forward ops, not its backward; a second
    # trace that differentiates it has only that graph, not the user's branch.
    gm = make_fx(lambda x: cond(x.sum() > 0, rounded, lambda a: a.sin(), (x,)))(leaf(POS))
    with pytest.raises(
        torchcond.UnsupportedCondError,
        match=r"custom torch.autograd.Function.*outside the make_fx trace",
    ):
        make_fx(lambda x: torch.autograd.grad(gm(x).sum(), x))(leaf(POS))


def test_aot_function_runs_a_custom_functions_own_backward():
    from functorch.compile import aot_function, make_boxed_func

    def f(x):
        return cond(x.sum() > 0, rounded, lambda a: a.sin(), (x,))

    compiled = aot_function(f, fw_compiler=lambda gm, _: make_boxed_func(gm))
    for x in (POS, NEG):
        xa, xb = leaf(x), leaf(x)
        want = grads(rounded(xb).sum() if x.sum() > 0 else xb.sin().sum(), [xb])
        assert_grads_equal(grads(compiled(xa).sum(), [xa]), want)


# Custom ops with their own derivatives, each calling the other: the second
# derivative of either runs the first one's derivative formula.
@torch.library.custom_op("torchcond_test::sine", mutates_args=())
def sine(x: torch.Tensor) -> torch.Tensor:
    return x.sin()


@torch.library.custom_op("torchcond_test::cosine", mutates_args=())
def cosine(x: torch.Tensor) -> torch.Tensor:
    return x.cos()


sine.register_fake(torch.empty_like)
cosine.register_fake(torch.empty_like)


def _save_input(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


sine.register_autograd(lambda ctx, g: g * cosine(ctx.saved_tensors[0]), setup_context=_save_input)
cosine.register_autograd(lambda ctx, g: -g * sine(ctx.saved_tensors[0]), setup_context=_save_input)


class TimesTen(torch.autograd.Function):
    """``sine(x)``, a custom op with a derivative of its own, with gradient 10 instead."""

    @staticmethod
    def forward(x):
        return sine(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return 10 * g


def second_derivative(branch, other):
    def second(x):
        out = cond(x.sum() > 0, branch, other, (x,))
        (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        return g, torch.autograd.grad(g.sum(), x)[0]

    return second


def test_a_traced_second_derivative_runs_custom_ops_own_derivatives():
    # The first derivative's graph holds the op the other's formula called, made with
    # grad off below its own autograd kernel. Run again with grad on, it is
    # differentiated by its own formula (this was refused as a custom Function).
    second = second_derivative(lambda a: sine(a) * a, lambda a: cosine(a) * a)
    for x in (POS, NEG):
        assert_traced_matches_eager(second, x)


def test_a_custom_op_inside_a_custom_function_keeps_the_functions_backward():
    # The op's own derivative is not the Function's: differentiated inside the trace,
    # the Function's backward runs; outside it, the refusal stands.
    assert_traced_matches_eager(second_derivative(lambda a: TimesTen.apply(a) * a, torch.cos), POS)
    gm = make_fx(lambda x: cond(x.sum() > 0, TimesTen.apply, lambda a: a.sin(), (x,)))(leaf(POS))
    with pytest.raises(
        torchcond.UnsupportedCondError,
        match=r"custom torch.autograd.Function.*outside the make_fx trace",
    ):
        make_fx(lambda x: torch.autograd.grad(gm(x).sum(), x))(leaf(POS))


@pytest.mark.parametrize("taken", [True, False])
def test_a_custom_function_over_closed_over_parameters_gets_their_gradients(taken):
    def f(x, w, p):
        out = cond(
            p,
            lambda a: TimesThree.apply(a * w) + TimesThree.apply(w),
            lambda a: a * w,
            (x,),
        )
        return torch.autograd.grad(out.sum(), (x, w))

    assert_traced_matches_eager(f, POS, NEG, torch.tensor(taken))


@pytest.mark.parametrize("taken", [True, False])
def test_a_custom_function_traces_to_the_second_derivative(taken):
    def second(branch):
        def f(x, p):
            out = cond(p, branch, lambda a: a.sin(), (x,))
            (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
            return g, torch.autograd.grad(g.sum(), x)[0]

        return f

    p = torch.tensor(taken)
    assert_traced_matches_eager(second(Square.apply), POS, p)
    # d/dx of round(x) * g (from the product rule) runs TimesThree's backward again.
    assert_traced_matches_eager(second(lambda a: TimesThree.apply(a) * a), POS, p)


def test_a_custom_function_in_a_nested_conditional_and_a_switch():
    def nested(x, p):
        inner = lambda a: cond(a.sum() > 1, lambda b: TimesThree.apply(b) * 2, torch.cos, (a,))  # noqa: E731
        out = cond(p, inner, torch.sin, (x,))
        return torch.autograd.grad(out.sum(), x)

    def switched(x, i):
        out = switch(i, [torch.sin, lambda a: TimesThree.apply(a) * 2, Square.apply], (x,))
        return torch.autograd.grad(out.sum(), x)

    for p in (True, False):
        assert_traced_matches_eager(nested, POS, torch.tensor(p))
    for i in range(3):
        assert_traced_matches_eager(switched, POS, torch.tensor(i))


def test_a_custom_function_in_forward_mode():
    import torch.autograd.forward_ad as fwAD

    def f(x, t, p):
        with fwAD.dual_level():
            out = cond(p, lambda a: TimesThree.apply(a) * 2, torch.sin, (fwAD.make_dual(x, t),))
            return (fwAD.unpack_dual(out).tangent,)

    for p in (True, False):
        assert_traced_matches_eager(f, POS, torch.ones(3, dtype=torch.float64), torch.tensor(p))


class _SquareWithJvpOnly(torch.autograd.Function):
    """A custom Function with a jvp and no backward, as JAX's custom_jvp."""

    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return 2 * x * t + 1  # not x*x's derivative: the Function's own rule must run


@pytest.mark.parametrize("function", ["jvp only", "jvp and backward"])
@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_a_custom_function_under_torch_func_jvp_traced(function, mode):
    """Ported from JAX's cond tests (issue 46): the traced tangent is the Python-if
    tangent, from the Function's own jvp."""
    fn = _SquareWithJvpOnly.apply if function == "jvp only" else TimesThree.apply

    def tangent(p, x, t):
        f = lambda x: cond(p, lambda a: fn(a) * 2, torch.sin, (x,))  # noqa: E731
        return torch.func.jvp(f, (x,), (t,))[1]

    def tangent_of_if(p, x, t):
        return torch.func.jvp(lambda x: fn(x) * 2 if p else torch.sin(x), (x,), (t,))[1]

    x, t = POS.clone(), torch.ones_like(POS)
    gm = make_fx(tangent, tracing_mode=mode)(torch.tensor(True), x, t)
    for p in (True, False):
        assert torch.allclose(gm(torch.tensor(p), x, t), tangent_of_if(p, x, t))


def test_a_no_grad_block_and_a_detach_beside_a_custom_function_to_the_second_derivative():
    def branch(a):
        with torch.no_grad():
            s = a.sum()
        return TimesThree.apply(a) * s + a.detach() * a + a**3

    def f(x, p):
        out = cond(p, branch, torch.sin, (x,))
        (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        return g, torch.autograd.grad(g.sum(), x)[0]

    for p in (True, False):
        assert_traced_matches_eager(f, POS, torch.tensor(p))


def test_a_custom_function_traces_where_nothing_differentiates_through_it():
    def f(x, y):
        out = cond(x.sum() > 0, lambda a, b: rounded(a) + b, lambda a, b: a - b, (x, y))
        return out, torch.autograd.grad(out.sum(), y)  # only y needs a gradient

    gm = make_fx(f, tracing_mode="fake")(POS, leaf(NEG))
    for x in (POS, NEG):
        assert_grads_equal(gm(x, leaf(NEG)), f(x, leaf(NEG)))
    inference = make_fx(lambda x: cond(x.sum() > 0, rounded, torch.sin, (x,)))(POS)
    torch.testing.assert_close(inference(POS), rounded(POS))


def test_a_nested_conditional_traces_to_the_second_derivative():
    # The inner node of a vjp graph is recorded inside torchcond's own
    # autograd.Function; that is not a custom Function whose backward is missing.
    def inner(a):
        return cond(a.sum() > 0.5, torch.sin, torch.cos, (a,))

    def second(x):
        out = cond(x.sum() > 0, inner, torch.tanh, (x,))
        (g,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        return g, torch.autograd.grad(g.sum(), x)[0]

    gm = make_fx(second, tracing_mode="fake")(leaf(POS))
    for x in (POS, NEG, POS * 0.01):
        assert_grads_equal(gm(leaf(x)), second(leaf(x)))


def sin_of_matmul(w):
    return lambda a: (a @ w).sin()


def cos_of_product(w):
    return lambda a: (a * w).cos()


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_a_traced_gradient_traces_each_branch_once(mode):
    w = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)

    def grad(x, w):
        out = cond(x.sum() > 0, sin_of_matmul(w), cos_of_product(w), (x,))
        return torch.autograd.grad(out.sum(), (x, w))

    # Every closure a factory makes shares the factory's inner code object.
    with Calls(true_fn=sin_of_matmul(w), false_fn=cos_of_product(w)) as calls:
        gm = make_fx(grad, tracing_mode=mode)(leaf(POS.expand(3, 3).clone()), w)
    # torch.cond runs each branch twice; here one trace serves the forward and the vjp.
    assert calls == {"true_fn": 1, "false_fn": 1}
    assert len(branch_graphs(gm)) == 4  # two forward branches, two vjp graphs
    for x in (POS.expand(3, 3).clone(), NEG.expand(3, 3).clone()):
        assert_grads_equal(gm(x, w), grad(leaf(x), w))


def test_aot_autograd_runs_each_branch_as_often_on_every_compile():
    from functorch.compile import aot_function, nop

    sin_branch = lambda a, w: a.sin() * w  # noqa: E731
    cos_branch = lambda a, w: a.cos() + w  # noqa: E731

    def f(x, w):
        return cond(x.sum() > 0, sin_branch, cos_branch, (x, w))

    for x in (POS, NEG):
        got_x, got_w = leaf(x), leaf(POS)
        with Calls(true_fn=sin_branch, false_fn=cos_branch) as calls:
            aot_function(f, nop, nop)(got_x, got_w).sum().backward()
        # Each branch runs to find the tensors it closes over, to find its writes,
        # for its output metadata, and in the joint trace. The backward runs none.
        assert calls == {"true_fn": 4, "false_fn": 4}
        want_x, want_w = leaf(x), leaf(POS)
        f(want_x, want_w).sum().backward()
        torch.testing.assert_close((got_x.grad, got_w.grad), (want_x.grad, want_w.grad))


def test_second_derivative_traces_each_branch_once():
    sin_branch = lambda a: a.sin() * a**2  # noqa: E731
    exp_branch = lambda a: a.exp() * a  # noqa: E731

    def second(x):
        out = cond(x.sum() > 0, sin_branch, exp_branch, (x,))
        (gx,) = torch.autograd.grad(out.sum(), (x,), create_graph=True)
        return torch.autograd.grad(gx.sum(), (x,))[0]

    with Calls(true_fn=sin_branch, false_fn=exp_branch) as calls:
        gm = make_fx(second, tracing_mode="fake")(leaf(POS))
    assert calls == {"true_fn": 1, "false_fn": 1}
    assert len(branch_graphs(gm)) == 6  # forward, vjp and vjp of the vjp, two branches each
    for x in (POS, NEG):
        torch.testing.assert_close(gm(x), second(leaf(x)))


# --- torch.func inside a trace: closures, constants, vjp_fn, forward over forward ------

Y = torch.tensor(2.0, dtype=torch.float64)


def closing_over(y):
    """A cond whose true branch reads ``y`` without receiving it."""
    return lambda x: cond(x.sum() < 3, lambda a: a * y, lambda a: 2.0 * a, (x,))


def closing_over_if(x, y):
    return x * y if x.sum() < 3 else 2.0 * x


def _per_argnum(transform):
    """``transform`` of ``f(x, y)`` with respect to x and with respect to y."""
    return {
        "grad_x": lambda f, x, y: torch.func.grad(lambda x, y: f(x, y).sum(), argnums=0)(x, y),
        "grad_y": lambda f, x, y: torch.func.grad(lambda x, y: f(x, y).sum(), argnums=1)(x, y),
        "jvp_x": lambda f, x, y: torch.func.jvp(lambda x: f(x, y), (x,), (torch.ones_like(x),))[1],
        "jvp_y": lambda f, x, y: torch.func.jvp(lambda y: f(x, y), (y,), (torch.ones_like(y),))[1],
        "jacrev_y": lambda f, x, y: torch.func.jacrev(f, argnums=1)(x, y),
        "jacfwd_y": lambda f, x, y: torch.func.jacfwd(f, argnums=1)(x, y),
        "hessian_xy": lambda f, x, y: torch.func.hessian(
            lambda x, y: f(x, y).sum(), argnums=(0, 1)
        )(x, y),
    }[transform]


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
@pytest.mark.parametrize(
    "transform",
    ["grad_x", "grad_y", "jvp_x", "jvp_y", "jacrev_y", "jacfwd_y", "hessian_xy"],
)
def test_torch_func_in_make_fx_differentiates_what_a_branch_closes_over(mode, transform):
    apply = _per_argnum(transform)

    def with_cond(x, y):
        return closing_over(y)(x)

    trace = functools.partial(make_fx, tracing_mode=mode)
    try:
        trace(lambda x, y: apply(lambda x, y: x * y, x, y))(POS * 0.1, Y)
    except (RuntimeError, GuardOnDataDependentSymNode) as error:
        # torch 2.11's hessian over two arguments reads sizes as ints while it traces,
        # with no conditional too; torchcond fails the same way, not otherwise.
        with pytest.raises(type(error)):
            trace(lambda x, y: apply(with_cond, x, y))(POS * 0.1, Y)
        return
    gm = trace(lambda x, y: apply(with_cond, x, y))(POS * 0.1, Y)
    for x in (POS * 0.1, POS * 2):  # true branch, then false
        for y in (Y, Y * 3):
            torch.testing.assert_close(gm(x, y), apply(closing_over_if, x, y))


def test_torch_func_in_make_fx_with_a_nested_switch_reading_an_outer_index():
    def f(x, k):
        i = k.sum().to(torch.int64)  # computed outside, read inside: a closure
        inner = lambda a: switch(i, [torch.sin, torch.cos, torch.tanh], (a,))  # noqa: E731
        return cond(x.sum() > 0, inner, lambda a: a * 3, (x,))

    def f_if(x, k):
        fns = [torch.sin, torch.cos, torch.tanh]
        return fns[min(max(int(k.sum()), 0), 2)](x) if x.sum() > 0 else x * 3

    grad = lambda f: lambda x, k: torch.func.grad(lambda x: f(x, k).sum())(x)  # noqa: E731
    k = torch.tensor([1.0])
    gm = make_fx(grad(f), tracing_mode="symbolic")(POS, k)
    for x in (POS, NEG - 3):
        for k in (torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([7.0])):
            torch.testing.assert_close(gm(x, k), grad(f_if)(x, k))


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_a_branch_that_makes_a_constant_differentiates_in_make_fx(mode):
    def f(x):
        return cond(
            x.sum() < 3, lambda a: torch.tensor(2.0, dtype=a.dtype), lambda a: 2.0 * a.sum(), (x,)
        )

    def f_if(x):
        return torch.tensor(2.0, dtype=x.dtype) if x.sum() < 3 else 2.0 * x.sum()

    gm = make_fx(torch.func.grad(f), tracing_mode=mode)(POS * 0.1)
    for x in (POS * 0.1, POS * 2):
        torch.testing.assert_close(gm(x), torch.func.grad(f_if)(x))


def test_a_branch_that_makes_a_constant_trains_under_aot_autograd():
    from functorch.compile import aot_function, nop

    def f(x):
        return cond(
            x.sum() < 3, lambda a: torch.tensor(2.0, dtype=a.dtype), lambda a: 2.0 * a.sum(), (x,)
        )

    def loss(f):
        return lambda x: f(x) + x.sum()  # differentiable whichever branch is taken

    compiled = aot_function(loss(f), nop, nop)
    for x in (POS * 0.1, POS * 2):
        got, want = leaf(x), leaf(x)
        compiled(got).backward()
        loss(f)(want).backward()
        torch.testing.assert_close(got.grad, want.grad)


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_make_fx_of_a_torch_func_vjp_fn(mode):
    f = lambda x: cond(x.sum() > 0, torch.sin, torch.cos, (x,))  # noqa: E731
    f_if = lambda x: x.sin() if x.sum() > 0 else x.cos()  # noqa: E731

    def pullback(f):
        return lambda x, ct: torch.func.vjp(f, x)[1](ct)[0]

    gm = make_fx(pullback(f), tracing_mode=mode)(POS, torch.ones(3, dtype=torch.float64))
    for x in (POS, NEG - 3):
        ct = torch.randn(3, dtype=torch.float64)
        torch.testing.assert_close(gm(x, ct), pullback(f_if)(x, ct))


def _jvp_of_jvp(f):
    def inner(x):
        return torch.func.jvp(f, (x,), (torch.ones_like(x),))[1]

    return lambda x: torch.func.jvp(inner, (x,), (torch.ones_like(x),))[1]


@pytest.mark.parametrize("op", ["cond", "switch"])
@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_forward_over_forward_traces(op, mode):
    if op == "cond":
        f = lambda x: cond(x.sum() > 0, torch.sin, torch.cos, (x,))  # noqa: E731
        f_if = lambda x: x.sin() if x.sum() > 0 else x.cos()  # noqa: E731
    else:
        fns = [torch.sin, torch.cos, torch.exp]
        f = lambda x: switch((x.sum() > 0).long() * 2, fns, (x,))  # noqa: E731
        f_if = lambda x: fns[2 if x.sum() > 0 else 0](x)  # noqa: E731
    gm = make_fx(_jvp_of_jvp(f), tracing_mode=mode)(POS)
    for x in (POS, NEG - 3):
        torch.testing.assert_close(gm(x), _jvp_of_jvp(f_if)(x))
    torch.func.jacfwd(torch.sin)(POS)  # forward AD still works afterwards


# --- what the taken branch did not read: None eagerly, zeros traced -----------------


def _adamw_step(run, strategy):
    """One AdamW step (weight decay on) of two Linears behind a cond on False."""
    torch.manual_seed(0)
    lt, lf = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    params = [*lt.parameters(), *lf.parameters()]
    opt = torch.optim.AdamW(params, lr=0.1, weight_decay=0.5)

    def f(p, x):
        return cond(p, lambda x: lt(x).sin(), lambda x: lf(x).cos(), (x,), strategy=strategy)

    run(f)(torch.tensor(False), torch.ones(2, 4)).sum().backward()
    grads = [p.grad for p in lt.parameters()]
    before = [p.detach().clone() for p in lt.parameters()]
    opt.step()
    return grads, before, list(lt.parameters())


def test_untaken_branch_parameters_get_none_eagerly_and_zeros_compiled():
    # Eagerly a Python `if`: the true branch's Linear is not in the autograd graph, so
    # its gradients are None and AdamW leaves it alone.
    grads, before, after = _adamw_step(lambda f: f, "auto")
    assert all(g is None for g in grads)
    for b, a in zip(before, after):
        torch.testing.assert_close(a, b)
    # Compiled (and traced) the backward is a conditional whose every branch returns
    # a gradient: zeros for the untaken side, and AdamW decays those weights.
    compiled = lambda f: torch.compile(f, backend="aot_eager", fullgraph=True)  # noqa: E731
    for run, strategy in ((compiled, "auto"), (lambda f: f, "select")):
        grads, before, after = _adamw_step(run, strategy)
        for g in grads:
            torch.testing.assert_close(g, torch.zeros_like(g))
        for b, a in zip(before, after):
            torch.testing.assert_close(a, b * (1 - 0.1 * 0.5))


@pytest.mark.parametrize("transform", ["jvp", "jacfwd"])
def test_compiled_forward_mode_through_a_branch_that_returns_a_constant(transform):
    # Compiled, jvp reads the output's tangent as the trace found it (the jvp
    # conditional gives one); the taken branch's constant has none of its own.
    def program(cond_or_if):
        def f(x, p):
            g = lambda x: cond_or_if(p, lambda x: torch.tensor(2.0), torch.sqrt, x)  # noqa: E731
            if transform == "jvp":
                return torch.func.jvp(g, (x,), (torch.ones_like(x),))
            return torch.func.jacfwd(g)(x)

        return f

    compiled = torch.compile(
        program(lambda p, f, g, x: cond(p, f, g, (x,))), backend="eager", fullgraph=True
    )
    python_if = program(lambda p, f, g, x: f(x) if p else g(x))
    x = torch.tensor(0.7)
    for p in (True, False):
        torch.testing.assert_close(compiled(x, torch.tensor(p)), python_if(x, p))
    # Forward-mode AD still works afterwards.
    torch.testing.assert_close(torch.func.jacfwd(torch.sin)(torch.zeros(2)), torch.eye(2))


@pytest.mark.parametrize("shape", [(), (3, 4)])
def test_old_value_op_passes_opcheck(shape):
    # The copy of a written operand that derivatives read (autograd._old_value).
    t = torch.randn(shape, requires_grad=True)
    torch.library.opcheck(torch.ops.torchcond.old_value.default, (t,))
    torch.testing.assert_close(torch.ops.torchcond.old_value(t), t)
