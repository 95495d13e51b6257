"""make_fx (real, fake, symbolic): one node per call, closure-free branch graphs."""

import re

import expecttest
import pytest
import torch
import torch.utils._pytree as pytree
from helpers import count_nodes, readable
from torch.fx.experimental.proxy_tensor import make_fx

import torchcond
from torchcond import cond, switch


def symbolic(fn, *args):
    return make_fx(fn, tracing_mode="symbolic")(*args)


class TestGraphs(expecttest.TestCase):
    def test_cond_graph(self):
        def f(x, y):
            return cond(x.sum() > 0, lambda x, y: x.cos() + y, lambda x, y: x.sin() - y, (x, y))

        gm = symbolic(f, torch.randn(4, 3), torch.randn(3))
        self.assertExpectedInline(
            readable(gm),
            """\
class f(torch.nn.Module):
    def forward(self, x_1: "f32[s75, s96]", y_1: "f32[s96]"):
        sum_1: "f32[]" = torch.ops.aten.sum.default(x_1)
        gt: "b8[]" = torch.ops.aten.gt.Scalar(sum_1, 0);  sum_1 = None
        true_graph_0 = self.true_graph_0
        false_graph_0 = self.false_graph_0
        torchcond_cond = torch.ops.higher_order.torchcond_cond(gt, true_graph_0, false_graph_0, (x_1, y_1));  gt = true_graph_0 = false_graph_0 = x_1 = y_1 = None
        getitem: "f32[s75, s96]" = torchcond_cond[0];  torchcond_cond = None
        return getitem
    class true_graph_0(torch.nn.Module):
        def forward(self, arg0_1: "f32[s75, s96]", arg1_1: "f32[s96]"):
            cos: "f32[s75, s96]" = torch.ops.aten.cos.default(arg0_1);  arg0_1 = None
            add: "f32[s75, s96]" = torch.ops.aten.add.Tensor(cos, arg1_1);  cos = arg1_1 = None
            return (add,)
    class false_graph_0(torch.nn.Module):
        def forward(self, arg0_1: "f32[s75, s96]", arg1_1: "f32[s96]"):
            sin: "f32[s75, s96]" = torch.ops.aten.sin.default(arg0_1);  arg0_1 = None
            sub: "f32[s75, s96]" = torch.ops.aten.sub.Tensor(sin, arg1_1);  sin = arg1_1 = None
            return (sub,)
""",
        )

    def test_closures_are_lifted_in_one_order(self):
        def f(x, w, b):
            n = b.shape[0]
            return cond(x.sum() > 0, lambda x: x * w + n, lambda x: x - b.sum(), (x,))

        gm = symbolic(f, torch.randn(4, 3), torch.randn(3), torch.randn(5))
        self.assertExpectedInline(
            readable(gm),
            """\
class f(torch.nn.Module):
    def forward(self, x_1: "f32[s75, s96]", w_1: "f32[s96]", b_1: "f32[s86]"):
        sum_1: "f32[]" = torch.ops.aten.sum.default(x_1)
        gt: "b8[]" = torch.ops.aten.gt.Scalar(sum_1, 0);  sum_1 = None
        sym_size_int: "Sym(s86)" = torch.ops.aten.sym_size.int(b_1, 0)
        true_graph_0 = self.true_graph_0
        false_graph_0 = self.false_graph_0
        torchcond_cond = torch.ops.higher_order.torchcond_cond(gt, true_graph_0, false_graph_0, (x_1, w_1, sym_size_int, b_1));  gt = true_graph_0 = false_graph_0 = x_1 = w_1 = sym_size_int = b_1 = None
        getitem: "f32[s75, s96]" = torchcond_cond[0];  torchcond_cond = None
        return getitem
    class true_graph_0(torch.nn.Module):
        def forward(self, arg0_1: "f32[s75, s96]", w_1: "f32[s96]", sym_size_int: "Sym(s86)", unused_lifted: "f32[s86]"):
            mul: "f32[s75, s96]" = torch.ops.aten.mul.Tensor(arg0_1, w_1);  arg0_1 = w_1 = None
            add: "f32[s75, s96]" = torch.ops.aten.add.Tensor(mul, sym_size_int);  mul = sym_size_int = None
            return (add,)
    class false_graph_0(torch.nn.Module):
        def forward(self, arg0_1: "f32[s75, s96]", unused_lifted: "f32[s96]", unused_lifted_1: "Sym(s86)", b_1: "f32[s86]"):
            sum_1: "f32[]" = torch.ops.aten.sum.default(b_1);  b_1 = None
            sub: "f32[s75, s96]" = torch.ops.aten.sub.Tensor(arg0_1, sum_1);  arg0_1 = sum_1 = None
            return (sub,)
""",
        )

    def test_switch_graph_reads_index_as_given_and_clones_identity(self):
        def f(i, x):
            return switch(i, [lambda x: x + 1, lambda x: x * 2, lambda x: x], (x,))

        gm = symbolic(f, torch.tensor(1), torch.randn(4))
        self.assertExpectedInline(
            readable(gm),
            """\
class f(torch.nn.Module):
    def forward(self, i_1: "i64[]", x_1: "f32[s57]"):
        branch_graph_0 = self.branch_graph_0
        branch_graph_1 = self.branch_graph_1
        branch_graph_2 = self.branch_graph_2
        torchcond_switch = torch.ops.higher_order.torchcond_switch(i_1, branch_graph_0, branch_graph_1, branch_graph_2, (x_1,));  i_1 = branch_graph_0 = branch_graph_1 = branch_graph_2 = x_1 = None
        getitem: "f32[s57]" = torchcond_switch[0];  torchcond_switch = None
        return getitem
    class branch_graph_0(torch.nn.Module):
        def forward(self, arg0_1: "f32[s57]"):
            add: "f32[s57]" = torch.ops.aten.add.Tensor(arg0_1, 1);  arg0_1 = None
            return (add,)
    class branch_graph_1(torch.nn.Module):
        def forward(self, arg0_1: "f32[s57]"):
            mul: "f32[s57]" = torch.ops.aten.mul.Tensor(arg0_1, 2);  arg0_1 = None
            return (mul,)
    class branch_graph_2(torch.nn.Module):
        def forward(self, arg0_1: "f32[s57]"):
            clone_default: "f32[s57]" = torch.ops.aten.clone.default(arg0_1);  arg0_1 = None
            return (clone_default,)
""",
        )


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_one_node_per_call_and_matches_eager(mode):
    w = torch.randn(3)

    def f(x, y):
        a = cond(x.sum() > 0, lambda x: x.cos() * y.sum(), lambda x: x.sin(), (x,))
        b = switch(y.argmax(), [lambda a: a + 1, lambda a: a * w, lambda a: a.exp()], (a,))
        return {"a": a, "b": b}

    x, y = torch.randn(4, 3), torch.randn(5)
    if mode != "real":
        w = torch.randn(3)  # a real closed-over constant cannot meet fake tensors
        f = _with_w_as_input(f)
        args = (x, y, w)
    else:
        args = (x, y)
    gm = make_fx(f, tracing_mode=mode)(*args)
    assert count_nodes(gm, "torchcond_cond") == 1
    assert count_nodes(gm, "torchcond_switch") == 1
    for sign in (1, -1):
        new = (sign * x.abs(), torch.randn(5), *args[2:])
        torch.testing.assert_close(gm(*new), f(*new))


def _with_w_as_input(f):
    def g(x, y, w):
        def t(x):
            return cond(x.sum() > 0, lambda x: x.cos() * y.sum(), lambda x: x.sin(), (x,))

        a = t(x)
        b = switch(y.argmax(), [lambda a: a + 1, lambda a: a * w, lambda a: a.exp()], (a,))
        return {"a": a, "b": b}

    return g


def test_sibling_and_nested_calls_get_distinct_names():
    def f(x):
        def outer_true(x):
            return cond(x.mean() > 0, lambda x: x + 1, lambda x: x - 1, (x,))

        a = cond(x.sum() > 0, outer_true, lambda x: x * 2, (x,))
        b = cond(x.max() > 0, lambda a: a.cos(), lambda a: a.sin(), (a,))
        return b

    gm = symbolic(f, torch.randn(3))
    names = {n for n, _ in gm.named_children()}
    assert names == {"true_graph_0", "false_graph_0", "true_graph_1", "false_graph_1"}
    nested = dict(gm.true_graph_0.named_children())
    assert set(nested) == {"true_graph_0", "false_graph_0"}
    for x in (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, 0.0, 3.0]), -torch.ones(3)):
        torch.testing.assert_close(gm(x), f(x))


def test_nested_closures_lift_through_every_level():
    def f(x, p):
        def outer_true(x):
            return cond(x.mean() > 0, lambda x: x * p, lambda x: x - 1, (x,))

        return cond(x.sum() > 0, outer_true, lambda x: x, (x,))

    gm = symbolic(f, torch.randn(3), torch.randn(3))
    top = next(
        n for n in gm.graph.nodes if n.op == "call_function" and "torchcond" in str(n.target)
    )
    assert [a.name for a in top.args[3]] == ["x_1", "p_1"]
    p = torch.randn(3)
    for x in (torch.ones(3), torch.tensor([2.0, -3.0, 0.5]), -torch.ones(3)):
        torch.testing.assert_close(gm(x, p), f(x, p))


def test_stack_traces_point_at_branch_code():
    def f(x):
        def true_branch(x):
            return x.cos() * 3  # the true branch's line

        return cond(x.sum() > 0, true_branch, lambda x: x.sin(), (x,))

    gm = make_fx(f, tracing_mode="symbolic", record_stack_traces=True)(torch.randn(3))
    traces = [
        n.meta.get("stack_trace", "")
        for n in gm.true_graph_0.graph.nodes
        if n.op == "call_function"
    ]
    assert traces and all("the true branch's line" in t for t in traces), traces
    text = gm.true_graph_0.print_readable(print_output=False)
    assert re.search(r"# File: .*test_tracing.py:\d+ in true_branch", text)


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_exported_stack_traces_point_at_the_users_lines(strict):
    class M(torch.nn.Module):
        def forward(self, x):
            def true_branch(x):
                return x.cos() * 3  # the true branch's line

            return cond(x.sum() > 0, true_branch, torch.sin, (x,))  # the call's line

    ep = torch.export.export(M(), (torch.randn(3),), strict=strict)
    gm = ep.graph_module

    def innermost(node):
        lines = (node.meta.get("stack_trace") or "").strip().splitlines()
        frames = [i for i, line in enumerate(lines) if line.lstrip().startswith("File ")]
        return "\n".join(lines[frames[-1] :]) if frames else ""

    (node,) = [n for n in gm.graph.nodes if n.target is torchcond.cond_op]
    assert "test_tracing.py" in innermost(node) and "the call's line" in innermost(node)
    for n in gm.true_graph_0.graph.nodes:
        if n.op == "call_function":
            assert "the true branch's line" in innermost(n), n.meta.get("stack_trace")


def test_differing_sizes_become_an_unbacked_size_with_a_range():
    def f(x):
        return cond(x.sum() > 0, lambda x: x[:2], lambda x: torch.cat([x, x]), (x,))

    gm = symbolic(f, torch.randn(5, 3))
    out = next(n for n in gm.graph.nodes if n.name == "getitem").meta["val"]
    size = out.shape[0]
    assert isinstance(size, torch.SymInt) and str(size).startswith("u")
    shape_env = size.node.shape_env
    vr = shape_env.var_to_range[size.node.expr]
    assert int(vr.lower) == 2
    for x in (torch.ones(4, 3), -torch.ones(4, 3)):
        torch.testing.assert_close(gm(x), f(x))


@pytest.mark.parametrize("tracing_mode", ["fake", "symbolic"])
def test_select_over_sizes_made_from_data_assumes_them_equal(tracing_mode):
    # strategy="select" needs equal shapes; two sizes made from data (unbacked) cannot
    # be compared while tracing: assumed equal, and a mismatch raises at run time.
    def rows(x):
        return (x > 1).nonzero().size(0) + 1

    def f(x, p, scale):
        return cond(
            p,
            lambda x: x * torch.ones(rows(x)).cos(),
            lambda x: x * torch.ones(rows(scale * x)).sin(),
            (x,),
            strategy="select",
        )

    one = torch.tensor(1.0)
    gm = make_fx(f, tracing_mode=tracing_mode)(torch.tensor(0.5), torch.tensor(True), one)
    for x, p in [(0.5, True), (1.5, False), (1.5, True)]:
        args = (torch.tensor(x), torch.tensor(p), one)
        torch.testing.assert_close(gm(*args), f(*args))
    with pytest.raises(ValueError, match="expected shape"):  # 1 row against 2
        gm(torch.tensor(0.6), torch.tensor(True), torch.tensor(2.0))


def test_outputs_with_different_strides_are_made_contiguous():
    def f(x):
        return cond(x.sum() > 0, lambda x: x.t().contiguous().t(), lambda x: x + 1, (x,))

    gm = symbolic(f, torch.randn(4, 3))
    for x in (torch.ones(4, 3), -torch.ones(4, 3)):
        out = gm(x)
        torch.testing.assert_close(out, f(x))
        assert out.is_contiguous()


def test_identity_and_view_outputs_do_not_alias_inputs():
    def f(x):
        return cond(x.sum() > 0, lambda x: (x, x[0]), lambda x: (x + 1, x[1] * 2), (x,))

    gm = symbolic(f, torch.randn(3, 2))
    x = torch.ones(3, 2)
    a, b = gm(x)
    assert (
        a.data_ptr() != x.data_ptr()
        and b.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    )
    torch.testing.assert_close((a, b), (x, x[0]))


def test_in_place_ops_on_branch_intermediates_are_fine():
    def f(x):
        def t(x):
            y = x * 2
            y.add_(1)
            return y

        return cond(x.sum() > 0, t, lambda x: x, (x,))

    gm = symbolic(f, torch.randn(3))
    torch.testing.assert_close(gm(torch.ones(3)), torch.full((3,), 3.0))


def test_functionalized_trace():
    def f(x):
        def t(x):
            y = x.clone()
            y.mul_(2)
            return y

        return cond(x.sum() > 0, t, lambda x: x - 1, (x,))

    gm = make_fx(torch.func.functionalize(f), tracing_mode="symbolic")(torch.randn(3))
    assert count_nodes(gm, "torchcond_cond") == 1
    targets = {n.target for n in gm.true_graph_0.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.mul_.Tensor not in targets and torch.ops.aten.mul.Tensor in targets
    for x in (torch.ones(3), -torch.ones(3)):
        torch.testing.assert_close(gm(x), f(x))


@pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])
def test_a_closure_under_grad_of_functionalize_traced_is_refused_and_an_operand_works(
    tracing_mode,
):
    # torch.func.grad around functionalize, traced: a tensor that the branches close
    # over reaches the conditional still wrapped by grad's level, which is set aside.
    # It used to recurse until Python's limit.
    x, y = torch.randn(3), torch.randn(3)

    def closed(x, y):
        return cond(x.sum() > 0, lambda x: (x * y).sin(), lambda x: (x * y).cos(), (x,)).sum()

    def passed(x, y):
        return cond(x.sum() > 0, lambda x, y: (x * y).sin(), lambda x, y: (x * y).cos(), (x, y))

    def traced(f):
        fn = torch.func.grad(torch.func.functionalize(f), argnums=(0, 1))
        return make_fx(fn, tracing_mode=tracing_mode)(x, y)

    with pytest.raises(torchcond.UnsupportedCondError, match="as operands"):
        traced(closed)
    gm = traced(lambda x, y: passed(x, y).sum())
    for sign in (1.0, -1.0):
        xs = sign * x.abs()
        want = torch.func.grad(lambda x, y: passed(x, y).sum(), argnums=(0, 1))(xs, y)
        for got, expected in zip(gm(xs, y), want):
            torch.testing.assert_close(got, expected)


def test_symbool_predicate_stays_symbolic():
    def f(x):
        return cond(x.shape[0] > 4, lambda x: x * 2, lambda x: x.cos(), (x,))

    gm = symbolic(f, torch.randn(6))
    assert count_nodes(gm, "torchcond_cond") == 1
    for n in (2, 9):
        x = torch.randn(n)
        torch.testing.assert_close(gm(x), f(x))


def test_python_bool_predicate_inlines_the_branch():
    gm = symbolic(lambda x: cond(True, lambda x: x + 1, lambda x: x - 1, (x,)), torch.randn(3))
    assert count_nodes(gm, "torchcond_cond") == 0
    assert "add" in gm.code and "sub" not in gm.code


def test_non_bool_tensor_predicate_reaches_the_operator_unchanged():
    """The operator takes the user's one-element tensor with no op before it, so a
    compiled program reads it when it runs (AOTInductor folds an op on a buffer)."""
    gm = symbolic(
        lambda p, x: cond(p, lambda x: x + 1, lambda x: x - 1, (x,)),
        torch.tensor([2.5]),
        torch.zeros(2),
    )
    node = next(
        n for n in gm.graph.nodes if n.op == "call_function" and "torchcond" in str(n.target)
    )
    assert node.args[0].op == "placeholder"
    assert node.args[0].meta["val"].dtype == torch.float32 and node.args[0].meta["val"].dim() == 1
    torch.testing.assert_close(gm(torch.tensor([0.0]), torch.zeros(2)), -torch.ones(2))
    torch.testing.assert_close(gm(torch.tensor([-3.0]), torch.zeros(2)), torch.ones(2))


def test_inputs_requiring_grad_never_inline_a_branch():
    def f(x):
        return cond(x.sum() > 0, lambda x: x.cos(), lambda x: x.sin(), (x,))

    x = torch.randn(3, requires_grad=True)
    for mode in ("real", "symbolic"):
        gm = make_fx(f, tracing_mode=mode)(x)
        assert count_nodes(gm, "torchcond_cond") == 1
        for sign in (1, -1):
            torch.testing.assert_close(gm(sign * x.abs()), f(sign * x.abs()))


@pytest.mark.parametrize("how", ["make_fx", "export"])
def test_a_trace_is_freed_once_the_caller_drops_it(how):
    # Nothing torchcond keeps between calls may reach a traced graph: 100 traces used
    # to leave 300 GraphModules alive for the life of the process.
    import gc
    import weakref

    def f(x):
        return cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))

    class M(torch.nn.Module):
        def forward(self, x):
            return f(x)

    def trace():
        x = torch.randn(4)
        if how == "make_fx":
            return make_fx(f, tracing_mode="fake")(x)
        return torch.export.export(M(), (x,)).graph_module

    gm = trace()
    refs = [weakref.ref(m) for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]
    assert len(refs) == 3  # the trace and its two branch graphs
    del gm
    trace()  # torch.export itself holds on to its latest trace, ours or not
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


_NONE_OUTPUTS = {
    "None": (lambda x: None, lambda x: None),
    "tuple with None": (lambda x: (None, x + 1), lambda x: (None, x - 1)),
    "dict with None": (lambda x: {"a": None, "b": [x * 2]}, lambda x: {"a": None, "b": [x * 3]}),
    "empty": (lambda x: (), lambda x: ()),
}


def _none_output_modes():
    def export(fn, strict):
        class M(torch.nn.Module):
            def forward(self, x):
                return fn(x)

        return lambda x: torch.export.export(M(), (x,), strict=strict).module()(x)

    return {
        "eager": lambda fn: fn,
        "make_fx": lambda fn: lambda x: make_fx(fn)(x)(x),
        "make_fx symbolic": lambda fn: lambda x: make_fx(fn, tracing_mode="symbolic")(x)(x),
        "export": lambda fn: export(fn, strict=False),
        "export strict": lambda fn: export(fn, strict=True),
        "compile": lambda fn: torch.compile(fn, backend="aot_eager", fullgraph=True),
    }


@pytest.mark.parametrize("mode", list(_none_output_modes()))
@pytest.mark.parametrize("outputs", list(_NONE_OUTPUTS))
def test_none_outputs_come_back_as_in_eager(mode, outputs):
    # torch's pytree makes None a leaf; a conditional's outputs are tensors, so a None
    # is kept in the structure and rebuilt, in every mode, as a Python `if` returns it.
    true_fn, false_fn = _NONE_OUTPUTS[outputs]
    torch._dynamo.reset()

    def fn(x):
        return cond(x.sum() > 0, true_fn, false_fn, (x,))

    x = torch.ones(3)
    for sign in (1, -1):
        expected = true_fn(sign * x) if sign > 0 else false_fn(sign * x)
        got = _none_output_modes()[mode](fn)(sign * x)
        assert pytree.tree_structure(got) == pytree.tree_structure(expected)
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("mode", ["make_fx", "compile"])
def test_none_against_a_tensor_is_a_structure_mismatch(mode):
    def fn(x):
        return cond(x.sum() > 0, lambda x: (None, x + 1), lambda x: (x, x - 1), (x,))

    with pytest.raises(
        Exception,
        match=r"(true_fn returns \(None, Tensor\), false_fn returns \(Tensor, Tensor\)|different pytree structures)",
    ):
        _none_output_modes()[mode](fn)(torch.ones(3))


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4)])
def test_symbolic_trace_with_equal_dims_and_different_strides(shape):
    # x + 1 and x.mT + 1 agree on sizes only because the dims are equal; their strides
    # differ, so both branches return contiguous outputs. Reading the strides (s0**2)
    # must not reach the parent trace.
    def f(x):
        return cond(x.sum() > 0, lambda x: x + 1, lambda x: x.mT + 1, (x,))

    def g(i, x):
        return switch(i, [lambda x: x + 1, lambda x: x.mT * 2, lambda x: x.mT.contiguous()], (x,))

    x = torch.randn(*shape)
    gm = make_fx(f, tracing_mode="symbolic")(x)
    gm_switch = make_fx(g, tracing_mode="symbolic")(torch.tensor(0), x)
    for sign in (1, -1):
        assert torch.equal(gm(sign * x), f(sign * x))
        assert gm(sign * x).is_contiguous()
    for i in range(3):
        assert torch.equal(gm_switch(torch.tensor(i), x), g(torch.tensor(i), x))


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_legacy_cpp_functionalization(mode):
    # torch._to_functional_tensor, as older AOT code and PyTorch's own
    # test_cond_functionalized_aot_func_check_functional use it: the branch graphs
    # compute their outputs, with the in-place add functionalized away.
    def true_fn(x):
        y = x.cos()
        y.add_(5)
        return y * 3

    def false_fn(x):
        y = x.sin()
        y.add_(5)
        return y

    def f(x):
        return cond(x.sum() > 0, true_fn, false_fn, [x])

    def functionalized(*args):
        torch._enable_functionalization(reapply_views=False)
        try:
            out = f(*pytree.tree_map(torch._to_functional_tensor, args))
            return pytree.tree_map(torch._from_functional_tensor, out)
        finally:
            torch._disable_functionalization()

    x = torch.randn(4, 5)
    gm = make_fx(functionalized, tracing_mode=mode)(x)
    for sign in (1, -1):
        torch.testing.assert_close(gm(sign * x), f(sign * x))
    for branch in (gm.true_graph_0, gm.false_graph_0):
        targets = {n.target for n in branch.graph.nodes if n.op == "call_function"}
        assert torch.ops.aten.add_.Tensor not in targets
        assert not [
            n for n in branch.graph.nodes if n.op == "get_attr"
        ]  # no constant stands in for the output
        assert len(branch.graph.find_nodes(op="placeholder")) == 1  # x, not x twice
