"""torch.compile matrix: backend x {cond, switch} x predicate kind x {inference, training}.

Every case compiles a module whose branches close over a parameter and a buffer, runs
it on inputs that take every branch (an out-of-range switch index included), and
checks, against the same module run eagerly:

* outputs, and in training the gradients of the input and of every parameter;
* one compiled frame for all of those inputs: changing only the predicate's value
  never recompiles (``error_on_recompile`` turns a recompile into a failure);
* the dynamo graph holds exactly one of our operators, and no torch.cond.

Predicate kinds: ``tensor`` (a bool/int tensor argument), ``shape`` (from the input's
size, compiled with ``dynamic=True``), ``data`` (computed from the input's values),
``item`` (a Python scalar from ``.item()``: an unbacked SymBool/SymInt, with
``capture_scalar_outputs``).
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest
import torch
import torch.utils._pytree as pytree
from helpers import TORCH_VERSION
from torch._dynamo.testing import CompileCounterWithBackend

from torchcond import BranchMutationError, UnsupportedCondError, cond, switch

BACKENDS = ["eager", "aot_eager", "inductor"]
OPS = ["cond", "switch"]
PREDICATES = ["tensor", "shape", "data", "item"]
MODES = ["inference", "training"]


class Net(torch.nn.Module):
    def __init__(self, op: str, predicate: str):
        super().__init__()
        self.op = op
        self.predicate = predicate
        self.lin = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Parameter(torch.tensor(1.5))
        self.register_buffer("shift", torch.tensor(0.25))

    def selector(self, x, p):
        cond_op = self.op == "cond"
        if self.predicate == "tensor":
            return p
        if self.predicate == "shape":
            return x.shape[0] > 3 if cond_op else x.shape[0] - 3
        if self.predicate == "data":
            return x.sum() > 0 if cond_op else (x.mean() * 2).round().long()
        if cond_op:
            return x.sum().item() > 0
        return int((x.mean() * 2).round().long().item())

    def forward(self, x, p):
        branches = [
            lambda a: self.lin(a).tanh(),
            lambda a: (a * self.scale).sin() + self.shift,
            lambda a: a.cos() * self.lin.bias,
        ]
        selector = self.selector(x, p)
        if self.op == "cond":
            return cond(selector, branches[0], branches[1], (x,))
        return switch(selector, branches, (x,))


def inputs(op: str, predicate: str):
    """(x, p) pairs that, between them, take every branch."""
    torch.manual_seed(0)
    if predicate == "tensor":
        selectors = [True, False] if op == "cond" else [-1, 0, 1, 2, 7]
        return [(torch.randn(3, 4), torch.tensor(s)) for s in selectors]
    unused = torch.tensor(0)
    if predicate == "shape":
        rows = [2, 5] if op == "cond" else [2, 3, 4, 5, 6]  # index rows - 3: -1 .. 3
        return [(torch.randn(n, 4), unused) for n in rows]
    # data/item: cond on the sign of the sum, switch on round(2 * mean): -2, 0, 1, 2, 8.
    means = [1.0, -1.0] if op == "cond" else [-1.0, 0.0, 0.5, 1.0, 4.0]
    return [(torch.full((3, 4), m) + 0.01 * torch.randn(3, 4), unused) for m in means]


def our_nodes(gm: torch.fx.GraphModule):
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and getattr(n.target, "__name__", "").startswith("torchcond_")
    ]


# Inductor cannot bind the saved relation ``zuf0 > 0.0`` in the backward graph; the
# lowering refuses it with a clear message (test_inductor_refuses_a_saved_item_relation).
REFUSED = {("inductor", "cond", "item", "training")}
CASES = [c for c in itertools.product(BACKENDS, OPS, PREDICATES, MODES) if c not in REFUSED]


def case_param(case):
    marks = []
    if TORCH_VERSION == (2, 11) and case == ("inductor", "cond", "shape", "training"):
        # The backward graph takes the SymBool ``s0 > 3`` as an input, which Inductor
        # 2.11 rejects ("Unsupported inductor graph input type"); torch.cond too.
        marks.append(
            pytest.mark.xfail(reason="Inductor 2.11 rejects a SymBool graph input", strict=True)
        )
    return pytest.param(*case, id="-".join(case), marks=marks)


@pytest.mark.parametrize("backend,op,predicate,mode", [case_param(c) for c in CASES])
def test_compiled_matches_eager_without_recompiling(backend, op, predicate, mode):
    torch._dynamo.reset()
    model = Net(op, predicate)
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(
        model, backend=counter, fullgraph=True, dynamic=True if predicate == "shape" else None
    )
    config = {"error_on_recompile": True, "capture_scalar_outputs": predicate == "item"}
    with torch._dynamo.config.patch(config):
        for x, p in inputs(op, predicate):
            if mode == "inference":
                with torch.no_grad():
                    torch.testing.assert_close(compiled(x, p), model(x, p))
                continue
            x = x.requires_grad_()
            wrt = [x, *model.parameters()]
            got = torch.autograd.grad(compiled(x, p).square().sum(), wrt, allow_unused=True)
            want = torch.autograd.grad(model(x, p).square().sum(), wrt, allow_unused=True)
            for name, g, w in zip(["x", *dict(model.named_parameters())], got, want):
                # A parameter the taken branch does not read: None when the branch runs
                # as Python (eagerly, or under the eager backend), zeros when the
                # derivative is a traced conditional (one structure for all branches).
                if w is None and g is not None:
                    w = torch.zeros_like(g)
                torch.testing.assert_close(
                    g, w, msg=lambda m, name=name: f"gradient of {name}: {m}"
                )

    assert counter.frame_count == 1
    (graph,) = counter.graphs
    nodes = our_nodes(graph)
    assert [n.target.__name__ for n in nodes] == [f"torchcond_{op}"]
    assert all(n.target is not torch.ops.higher_order.cond for n in graph.graph.nodes)
    # Branches are subgraphs of the dynamo graph; the parameters and the buffer they
    # close over are lifted into explicit operands.
    (node,) = nodes
    branch_attrs = node.args[1:-1]
    assert len(branch_attrs) == (2 if op == "cond" else 3)
    assert all(isinstance(getattr(graph, a.target), torch.fx.GraphModule) for a in branch_attrs)
    tensors = [a for a in node.args[-1] if isinstance(a.meta["example_value"], torch.Tensor)]
    assert len(tensors) == 1 + 4  # x, then lin.weight, lin.bias, scale, shift


def test_inductor_refuses_a_saved_item_relation():
    # torch.cond compiles this and fails at run time with "name 'zuf0' is not defined".
    torch._dynamo.reset()
    model = Net("cond", "item")
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    x = torch.randn(3, 4, requires_grad=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        with pytest.raises(
            Exception, match=r"torchcond_cond: Inductor cannot compile .* \.item\(\)"
        ) as info:
            compiled(x, torch.tensor(0)).sum().backward()
    assert any(isinstance(e, UnsupportedCondError) for e in _chain(info.value))


def _chain(error):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


# --- Inductor lowers to its conditional IR, not to a Python fallback -------------------


def inductor_code(fn, *args, dynamic=None):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch.no_grad():
        out, codes = run_and_get_code(
            torch.compile(fn, backend="inductor", fullgraph=True, dynamic=dynamic), *args
        )
    torch.testing.assert_close(out, fn(*args))
    return "\n".join(codes)


def defined_functions(code: str) -> list[str]:
    return [
        line.split("(")[0][4:]
        for line in code.splitlines()
        if line.startswith("def ") and "(args)" in line
    ]


# torch 2.14 lowers conditionals to the N-way ir.Switch: the selector is read into a
# local once, then ``if sel == 0: ... elif sel == 1: ... else:``. torch 2.11 and 2.13
# have the two-way ir.Conditional: ``if pred: ... else:``.
N_WAY_IR = TORCH_VERSION >= (2, 14)


def branch_lines(code: str) -> list[str]:
    lines = [line.strip() for line in code.splitlines()]
    return [
        line
        for line in lines
        if line.startswith(("if ", "elif ")) and line.endswith(":") and "__name__" not in line
    ]


def selector_lines(code: str) -> list[str]:
    """ir.Switch's ``bufN_selector = int(...)`` lines (torch 2.14 on)."""
    return [line.strip() for line in code.splitlines() if re.match(r"\s*buf\d+_selector = ", line)]


def no_fallback(code: str) -> bool:
    # The operator may be named in assert messages; it must never be called.
    return "higher_order.torchcond_" not in code and "torchcond_cond(" not in code.replace(
        "def torchcond_cond", ""
    )


def test_inductor_lowers_cond_to_a_host_branch_over_compiled_subgraphs():
    def f(x, p):
        return cond(p, lambda a: a.cos() * a, lambda a: a.sin() + 1, (x,))

    code = inductor_code(f, torch.randn(8), torch.tensor(True))
    # A tensor predicate is read once, on the host.
    if N_WAY_IR:
        assert defined_functions(code) == ["false_graph_0", "true_graph_0"]  # 0 is false
        (read,) = selector_lines(code)
        assert read.endswith(".item())"), read  # "buf0_selector = int(arg1_1.item())"
        assert branch_lines(code) == [f"if {read.split()[0]} == 0:"]
    else:
        assert defined_functions(code) == ["true_graph_0", "false_graph_0"]
        (line,) = branch_lines(code)
        assert line.endswith(".item():")
    assert no_fallback(code)
    # Each branch is a compiled kernel, not a call back into Python.
    assert code.count("cpp_fused_") >= 2


def test_inductor_lowers_a_shape_predicate_to_a_symbolic_if():
    def f(x):
        return cond(x.shape[0] > 4, lambda a: a.cos(), lambda a: a.sin(), (x,))

    code = inductor_code(f, torch.randn(8), dynamic=True)
    if N_WAY_IR:
        (read,) = selector_lines(code)
        assert re.fullmatch(r"buf\d+_selector = int\(s\d+ > 4\)", read), read
        assert len(branch_lines(code)) == 1
    else:
        (line,) = branch_lines(code)
        assert line.startswith("if s") and line.endswith(" > 4:"), line  # e.g. "if s77 > 4:"
    assert no_fallback(code)


def test_inductor_lowers_switch_to_host_branches():
    branches = [lambda a: a + 1, lambda a: a * 2, lambda a: a.cos(), lambda a: a.sin()]

    def f(x, i):
        return switch(i, branches, (x,))

    compiled = torch.compile(f, backend="inductor", fullgraph=True)
    for i in (-3, 0, 1, 2, 3, 9):
        x = torch.randn(8)
        torch.testing.assert_close(compiled(x, torch.tensor(i)), f(x, torch.tensor(i)))
    code = inductor_code(f, torch.randn(8), torch.tensor(1))
    functions = defined_functions(code)
    if N_WAY_IR:
        # One ir.Switch over the clamped index: read once, then if/elif/elif/else.
        (read,) = selector_lines(code)
        selector = read.split()[0]
        assert branch_lines(code) == [
            f"if {selector} == 0:",
            f"elif {selector} == 1:",
            f"elif {selector} == 2:",
        ]
        assert functions == [f"branch_graph_{k}" for k in range(4)]
    else:
        # switch(i, b0, b1, b2, b3) = b0 if i <= 0 else switch(i - 1, b1, b2, b3), and so
        # on: three host branches, each in the function of the link it belongs to.
        assert len(branch_lines(code)) == 3
        assert sum(name.endswith("_rest") for name in functions) == 2
    assert no_fallback(code)


def test_select_strategy_compiles_with_inductor_without_a_host_branch():
    def f(x, i):
        y = cond(x.sum() > 0, lambda a: a.sin(), lambda a: a.cos(), (x,), strategy="select")
        return switch(
            i, [lambda a: a * 3, lambda a: a.exp(), lambda a: -a], (y,), strategy="select"
        )

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="inductor", fullgraph=True)
    for sign in (1.0, -1.0):
        for i in (-1, 1, 5):
            x = (sign * torch.rand(5)).requires_grad_()
            index = torch.tensor(i)
            torch.testing.assert_close(compiled(x, index), f(x, index))
            (got,) = torch.autograd.grad(compiled(x, index).sum(), x)
            (want,) = torch.autograd.grad(f(x, index).sum(), x)
            torch.testing.assert_close(got, want)
    code = inductor_code(f, torch.rand(5), torch.tensor(1))
    assert branch_lines(code) == []  # every branch runs; the fused select picks on the device
    assert "torchcond.select" in code and "torchcond.select_n" in code


@pytest.mark.parametrize("op", ["cond", "switch"])
def test_a_branch_making_a_tensor_constant_compiles_with_inductor(op):
    # The constant becomes an operand of the branches; Inductor's fake-tensor updater
    # refused its real value beside the operand's fake one.
    branches = [lambda x: torch.tensor(2.0), torch.sqrt, lambda x: torch.full_like(x, 3.0)]

    def f(x, s):
        if op == "cond":
            return cond(s > 0, branches[0], branches[1], (x,))
        return switch(s, branches, (x,))

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="inductor", fullgraph=True)
    for s in (0, 1, 2):
        x, selector = torch.tensor(0.5), torch.tensor(s)
        torch.testing.assert_close(compiled(x, selector), f(x, selector))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("transform", ["grad", "jvp", "vmap_grad"])
def test_select_strategy_under_torch_func_transforms(backend, transform):
    # Compiled code calls the select operator itself: its derivative under each
    # transform must be the Python if's (it was a zero tangent under jvp, and an error
    # about autograd.Function's setup_context under grad).
    def f(x, p):
        return cond(p, torch.sin, torch.cos, (x,), strategy="select")

    def python_if(x, p):
        return torch.sin(x) if bool(p) else torch.cos(x)

    def transformed(f):
        if transform == "grad":
            return torch.func.grad(lambda x, p: f(x, p).sum())
        if transform == "jvp":
            return lambda x, p: torch.func.jvp(lambda x: f(x, p), (x,), (torch.ones_like(x),))
        return torch.vmap(torch.func.grad(f))

    torch._dynamo.reset()
    compiled = torch.compile(transformed(f), backend=backend, fullgraph=True)
    x = torch.tensor([0.8, 0.3])
    for taken in (True, False):
        if transform == "vmap_grad":  # a predicate per example
            p = torch.tensor([taken, not taken])
            want = torch.stack([torch.func.grad(python_if)(x[i], p[i]) for i in range(2)])
        else:
            p = torch.tensor(taken)
            want = transformed(python_if)(x, p)
        torch.testing.assert_close(compiled(x, p), want)


@pytest.mark.parametrize("closed_over", [False, True])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_select_strategy_gradient_under_torch_func_grad_has_no_nan(backend, closed_over):
    # sqrt's derivative at 0 is infinite: the untaken branch's inputs are read through
    # a select so that it cannot reach the gradient. Dynamo shows a tensor that
    # torch.func.grad differentiates as not requiring grad, which skipped that select.
    def f(x, p):
        if closed_over:
            branches = (lambda: torch.tensor(2.0), lambda: torch.sqrt(x))
            return cond(p, *branches, (), strategy="select")
        return cond(p, lambda x: torch.tensor(2.0), torch.sqrt, (x,), strategy="select")

    torch._dynamo.reset()
    compiled = torch.compile(torch.func.grad(f), backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(torch.tensor(0.0), torch.tensor(True)), torch.tensor(0.0))


@pytest.mark.parametrize("inner", ["auto", "select"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_select_strategy_with_a_conditional_in_a_branch(backend, inner):
    # Dynamo traces the select's branches inline, under a mode that reads closed-over
    # tensors; the inner conditional's branches cannot enter it, nor speculate in it.
    def f(x, y, p, q):
        def true_fn(x):
            return cond(q, lambda x: x * y.sqrt(), torch.cos, (x,), strategy=inner)

        return cond(p, true_fn, lambda x: 2 * x, (x,), strategy="select")

    def python_if(x, y, p, q):
        if not p:
            return 2 * x
        return x * y.sqrt() if q else torch.cos(x)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    for p, q in itertools.product([True, False], repeat=2):
        # y = 0: sqrt's derivative is infinite, which must not reach y's gradient
        # (as NaN) from a branch that is not taken.
        x, y = torch.tensor(0.7, requires_grad=True), torch.tensor(0.0, requires_grad=True)
        args = (torch.tensor(p), torch.tensor(q))
        out = compiled(x, y, *args)
        got = torch.autograd.grad(out, (x, y), allow_unused=True, materialize_grads=True)
        want_out = python_if(x, y, *args)
        want = torch.autograd.grad(want_out, (x, y), allow_unused=True, materialize_grads=True)
        torch.testing.assert_close((out, *got), (want_out, *want))
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, y, *args), python_if(x, y, *args))


@pytest.mark.parametrize(
    "write",
    [
        lambda b: b.add_(1.0),
        lambda b: b[0:2].mul_(2.0),
        lambda b: b.__setitem__(0, 5.0),
        lambda b: b.unsqueeze(0).copy_(b + 1.0),
        lambda b: b.__iadd__(1.0),
    ],
    ids=["add_", "view", "setitem", "view_copy", "iadd"],
)
def test_select_strategy_refuses_writes_under_compiled_vmap(write):
    # Under vmap, dynamo's own write check reads the batched wrapper's version, which
    # a write inside it leaves unchanged: the branch graph itself is checked.
    def writes(x, b):
        write(b)
        return x * b

    def f(x, y, p):
        return cond(p, writes, lambda x, b: x.cos(), (x, y), strategy="select")

    torch._dynamo.reset()
    y = torch.zeros(3, 2)
    compiled = torch.compile(
        lambda x, y, p: torch.vmap(f, in_dims=(0, 0, None))(x, y, p),
        backend="eager",
        fullgraph=True,
    )
    with pytest.raises(BranchMutationError, match=r"true_fn: input mutation .*strategy='select'"):
        compiled(torch.ones(3, 2), y, torch.tensor(True))
    torch.testing.assert_close(y, torch.zeros(3, 2))


@pytest.mark.parametrize("y_batched", [False, True], ids=["y_shared", "y_batched"])
@pytest.mark.parametrize("reads", ["operand", "closure"])
def test_gradient_of_vmap_with_a_shared_predicate_compiles_with_dynamic_shapes(reads, y_batched):
    # y_shared: the mapped branches' derivative graph takes the batch size from its
    # inputs, not from the enclosing trace (an internal AssertionError). y_batched, with
    # rows per example: the branch graphs take their size symbols before the batched
    # tensors, whose size dynamo cannot ask (a batching rule error).
    def f(x, y, p):
        if reads == "operand":
            return cond(p, lambda x, y: (x.sin(), y), lambda x, y: (x.cos(), y), (x, y))
        return cond(p, lambda x: (x * y, y), lambda x: (2 * x, y), (x,))

    def python_if(x, y, p):
        if reads == "operand":
            return (x.sin(), y) if p else (x.cos(), y)
        return (x * y, y) if p else (2 * x, y)

    y_dim = 0 if y_batched else None

    def grads(fn):
        def total(x, y, p):
            a, b = torch.vmap(fn, in_dims=(0, y_dim, None), out_dims=(0, y_dim))(x, y, p)
            return a.sum() + b.sum()

        return torch.func.grad(total, argnums=(0, 1))

    torch._dynamo.reset()
    compiled = torch.compile(grads(f), backend="aot_eager", fullgraph=True, dynamic=True)
    x, y = (
        (torch.randn(3, 4), torch.randn(3, 4)) if y_batched else (torch.randn(3), torch.randn(()))
    )
    for p in (True, False):
        torch.testing.assert_close(compiled(x, y, torch.tensor(p)), grads(python_if)(x, y, p))


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_select_strategy_refuses_writes_under_compile(backend):
    """Every branch runs under strategy="select": a write would land even when untaken."""
    buffer = torch.zeros(3)

    def writes_operand(x):
        x.add_(1)
        return x

    def writes_closure(x):
        buffer.add_(1)
        return x * 3

    def f(p, x, i):
        a = cond(p, writes_operand, lambda x: x * 2, (x,), strategy="select")
        return a, switch(i, [lambda x: x - 1, writes_closure], (x,), strategy="select")

    torch._dynamo.reset()
    x = torch.full((3,), 2.0)
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    with pytest.raises(Exception, match=r"true_fn: .*(mutation|[Mm]utating)"):
        compiled(torch.tensor(False), x, torch.tensor(0))
    torch.testing.assert_close(x, torch.full((3,), 2.0))

    def g(x, i):
        return switch(i, [lambda x: x - 1, writes_closure], (x,), strategy="select")

    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"branches\[1\]: .*(mutation|[Mm]utating)"):
        torch.compile(g, backend=backend, fullgraph=True)(x, torch.tensor(0))
    torch.testing.assert_close(buffer, torch.zeros(3))
    torch.testing.assert_close(x, torch.full((3,), 2.0))


# --- composition: what dynamo, AOTAutograd and Inductor do around a conditional -------


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_identity_branch_leaves_its_operand_as_it_was(backend):
    """A branch that returns its operand unchanged: the operand after the call is still
    the operand, not the conditional's result (each strategy, cond and switch)."""

    def f(x, i):
        outs = []
        for strategy in ("auto", "select"):
            a = cond(x < 3, lambda x: x, lambda x: 2 * x, (x,), strategy=strategy)
            b = cond(x < 3, lambda x: (x, x), lambda x: (2 * x, 4 * x), (x,), strategy=strategy)
            c = switch(i, [lambda x: x, lambda x: 2 * x], (x,), strategy=strategy)
            outs += [a, *b, c, a + x, c * x]
        return outs

    def python_if(x, i):
        a, b = (x, (x, x)) if x < 3 else (2 * x, (2 * x, 4 * x))
        c = x if i <= 0 else 2 * x
        return [a, *b, c, a + x, c * x] * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    for x, i in [(2, 0), (3, 1), (3, 0), (2, 1)]:
        x, i = torch.tensor(float(x)), torch.tensor(i)
        torch.testing.assert_close(compiled(x, i), python_if(x, i))


def test_an_identity_branch_returned_under_training():
    def f(x):
        y = cond(x.sum() < 3, lambda x: x, lambda x: x.sin(), (x,))
        return y * x

    def python_if(x):
        return (x if x.sum() < 3 else x.sin()) * x

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for x in (torch.ones(3) * 0.5, torch.ones(3) * 2):
        x = x.requires_grad_()
        torch.testing.assert_close(compiled(x), python_if(x))
        (got,) = torch.autograd.grad(compiled(x).sum(), x)
        (want,) = torch.autograd.grad(python_if(x).sum(), x)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_size_made_inside_a_branch(backend):
    """An unbacked size created in both branches (``nonzero``) becomes one unbacked size
    of the node, through AOTAutograd and Inductor, as with torch.cond."""

    def branches(where):
        return (
            lambda x: torch.ones(where(x).size(0), 8).cos(),
            lambda x: torch.ones(where(x).size(0), 8).sin() + x.sum(),
        )

    def ours(x):
        return cond(x.sum() > 0, *branches(torch.nonzero), (x,))

    def theirs(x):
        return torch.cond(x.sum() > 0, *branches(torch.nonzero), (x,))

    def python_if(x):
        true_fn, false_fn = branches(torch.nonzero)
        return true_fn(x) if x.sum() > 0 else false_fn(x)

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        for fn in (ours, theirs):
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=backend, fullgraph=True)
            for x in (torch.tensor([1.0, 0.0, 2.0]), torch.tensor([-1.0, 0.0, -2.0, -3.0])):
                torch.testing.assert_close(compiled(x), python_if(x))


@pytest.mark.parametrize("tracing_mode", ["fake", "symbolic"])
def test_a_size_made_inside_a_branch_under_make_fx(tracing_mode):
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return cond(x.sum() > 0, lambda x: x.nonzero() * 2, lambda x: x.nonzero(), (x,))

    gm = make_fx(f, tracing_mode=tracing_mode)(torch.tensor([1.0, 0.0, 2.0]))
    for x in (torch.tensor([1.0, 0.0, 2.0]), torch.tensor([-1.0, 0.0, -2.0, -3.0])):
        torch.testing.assert_close(gm(x), x.nonzero() * 2 if x.sum() > 0 else x.nonzero())


def test_training_with_a_closure_over_a_view_of_symbolic_size():
    """The backward's branch graphs take the size symbol (``s0`` of ``4*s0``) as an
    input, as the forward's do: Inductor compiles each graph on its own."""

    def branches(v, w):
        return lambda: (v @ w).sin(), lambda: (v @ w).cos()

    def ours(x, w):
        v = x.view(-1, 4)
        return cond(v.sum() > 0, *branches(v, w), ())

    def theirs(x, w):
        v = x.view(-1, 4)
        return torch.cond(v.sum() > 0, *branches(v, w), ())

    def python_if(x, w):
        v = x.view(-1, 4)
        true_fn, false_fn = branches(v, w)
        return true_fn() if v.sum() > 0 else false_fn()

    torch.manual_seed(0)
    cases = [(torch.rand(2, 4, 4), torch.randn(4, 4)), (-torch.rand(3, 4, 4), torch.randn(4, 4))]
    for fn in (ours, theirs):
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="inductor", fullgraph=True, dynamic=True)
        for x, w in cases:
            x, w = x.requires_grad_(), w.requires_grad_()
            got = compiled(x, w)
            want = python_if(x, w)
            torch.testing.assert_close(got, want)
            grads = torch.autograd.grad(got.square().sum(), (x, w))
            torch.testing.assert_close(grads, torch.autograd.grad(want.square().sum(), (x, w)))


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor


pytree.register_pytree_node(
    Pair,
    lambda p: ([p.a, p.b], None),
    lambda values, _: Pair(*values),
    flatten_with_keys_fn=lambda p: (
        [(pytree.GetAttrKey("a"), p.a), (pytree.GetAttrKey("b"), p.b)],
        None,
    ),
)


def _nested_true(d, items, pair):
    return {"s": d["x"] + items[0] * pair.a, "t": [items[1][0] - pair.b, (d["x"],)]}


def _nested_false(d, items, pair):
    return {"s": d["x"] - items[0], "t": [items[1][0] * pair.b, (pair.a.sin(),)]}


@pytest.mark.parametrize("strategy", ["auto", "select"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_pytree_operands_and_outputs(backend, strategy):
    """Operands are flattened as eagerly (a custom node, dicts, lists, tuples, nested),
    and outputs come back in the structure the branches return."""

    def f(x, d, items, pair, i):
        out = cond(x.sum() > 0, _nested_true, _nested_false, (d, items, pair), strategy=strategy)
        summed = cond(x.sum() > 0, lambda p: p.a + p.b, lambda p: p.a - p.b, (pair,))
        chosen = switch(i, [_nested_false, _nested_true], (d, items, pair), strategy=strategy)
        return out, summed, chosen

    def python_if(x, d, items, pair, i):
        out = (_nested_true if x.sum() > 0 else _nested_false)(d, items, pair)
        summed = pair.a + pair.b if x.sum() > 0 else pair.a - pair.b
        chosen = (_nested_false if i <= 0 else _nested_true)(d, items, pair)
        return out, summed, chosen

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    for sign, i in [(1.0, 0), (-1.0, 1), (1.0, 5)]:
        x = sign * torch.rand(3)
        args = (x, {"x": x * 2}, [x + 1, (x - 1,)], Pair(x.cos(), x.exp()), torch.tensor(i))
        torch.testing.assert_close(compiled(*args), python_if(*args))


def test_a_branch_returning_an_object_it_makes_is_refused_by_name():
    # Dynamo drops what a branch stores on an object it creates (torch.cond fails
    # here with "'Pair' object has no attribute 'a'"); select never returns the object.
    def f(x, strategy):
        return cond(
            x.sum() > 0,
            lambda x: Pair(x, x * 2),
            lambda x: Pair(x * 3, x),
            (x,),
            strategy=strategy,
        )

    x = torch.rand(3)
    torch._dynamo.reset()
    with pytest.raises(UnsupportedCondError, match=r"true_fn returns a Pair: under torch\.compile"):
        torch.compile(f, backend="eager", fullgraph=True)(x, "auto")
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x, "select")
    torch.testing.assert_close((got.a, got.b), (x, x * 2))


def _second_order_forward(transform, op):
    """A second-order derivative of a conditional whose branches are linear, so that
    the first-order derivatives are constants."""

    def f(x, s):
        if op == "cond":
            return cond(s, lambda x: x, lambda x: 2 * x, (x,))
        return switch(s.long(), [lambda x: 3 * x, lambda x: x, torch.sin], (x,))

    ones = torch.ones(3)
    if transform == "jvp.jvp":

        def inner(x, s):
            return torch.func.jvp(lambda x: f(x, s), (x,), (ones,))

        return lambda x, s: torch.func.jvp(lambda x: inner(x, s), (x,), (ones,))
    if transform == "jvp.grad":
        grad = torch.func.grad(lambda x, s: f(x, s).sum())
        return lambda x, s: torch.func.jvp(lambda x: grad(x, s), (x,), (ones,))
    return torch.func.hessian(lambda x, s: f(x, s).sum())


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("transform", ["jvp.jvp", "jvp.grad", "hessian"])
@pytest.mark.parametrize("op", ["cond", "switch"])
def test_second_order_forward_mode_with_constant_derivatives(backend, transform, op):
    # The code dynamo compiles around the operator would read a tangent of each first
    # derivative; the taken branch has none. torch.cond raises on jvp of jvp, eagerly
    # and compiled.
    fn = _second_order_forward(transform, op)
    x = torch.linspace(-1.0, 1.0, 3)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for s in (torch.tensor(True), torch.tensor(False)):
        torch.testing.assert_close(compiled(x, s), fn(x, s))
    # A later forward-mode derivative works: no level was left on.
    torch.testing.assert_close(torch.func.jacfwd(torch.sin)(x), torch.diag(x.cos()))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_training_reads_what_a_branch_wrote(backend):
    # The gradient reads the buffer after the branch's write. Derivatives recompute the
    # branch from the value before it, which Inductor must keep past the write-back.
    def add_one(x, buffer):
        buffer.add_(1.0)
        return x * buffer

    def f(x, buffer, p):
        return cond(p, add_one, lambda x, buffer: x.cos(), (x, buffer))

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    for p in (torch.tensor(True), torch.tensor(False)):
        grads = []
        for fn in (compiled, f):
            x, buffer = torch.tensor([0.8, -0.3], requires_grad=True), torch.tensor([1.7, 2.0])
            out = fn(x, buffer, p)
            grads.append((out, torch.autograd.grad(out.sum(), x)[0], buffer))
        torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("op", ["cond", "switch"])
def test_training_passes_a_gradient_through_beside_another(op):
    # Both output gradients are one tensor (the sum of both outputs). Inductor must not
    # compute the first in place in that tensor, which the second passes through.
    def f(x, y, s):
        if op == "cond":
            return cond(s > 0, lambda x, y: (x.sin(), y), lambda x, y: (x.cos(), y), (x, y))
        return switch(s, [lambda x, y: (x.sin(), y), lambda x, y: (2 * x, y)], (x, y))

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="inductor", fullgraph=True)
    for s in (torch.tensor(0), torch.tensor(1)):
        grads = []
        for fn in (compiled, f):
            x, y = torch.tensor(0.8, requires_grad=True), torch.tensor(1.7, requires_grad=True)
            a, b = fn(x, y, s)
            grads.append(torch.autograd.grad(a.sum() + b.sum(), (x, y)))
        torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("op", ["cond", "switch"])
def test_inductor_compiles_torch_func_grad_of_an_identity_branch(op):
    # The copy of an output that is an input is recorded in the branch graph with a
    # plain value, not one wrapped by the grad level the trace ran under.
    def f(x, s):
        if op == "cond":
            out = cond(s > 0, lambda x: x, lambda x: 2 * x, (x,))
        else:
            out = switch(s, [lambda x: x, lambda x: 2 * x, torch.sin], (x,))
        return out.sum()

    torch._dynamo.reset()
    compiled = torch.compile(torch.func.grad(f), backend="inductor", fullgraph=True)
    x = torch.tensor([0.5, -1.0])
    for s in (torch.tensor(0), torch.tensor(1), torch.tensor(2)):
        torch.testing.assert_close(compiled(x, s), torch.func.grad(f)(x, s))
