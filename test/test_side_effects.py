"""In-place writes inside branches: to operands, views of them, closed-over tensors and
module buffers. Every mode must give what a Python ``if`` gives: the taken branch's
writes land, the untaken branch's do not. The reference is the eager call, which is
that ``if``."""

from __future__ import annotations

import copy
import io
import itertools
import re

import pytest
import torch
from torch.export import Dim
from torch.fx.experimental.proxy_tensor import make_fx

from torchcond import BranchMutationError, cond, switch

BACKENDS = pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
STRICTNESS = pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])
TRACING = pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])


# Each takes (x, y), writes to y (or a view of it) in some branch, and returns a value.
def writes_operand(x, y):
    def t(x, y):
        y.add_(1)
        return x + 1

    return cond(x.sum() > 0, t, lambda x, y: x - 1, (x, y))


def writes_a_view(x, y):
    def t(x, y):
        y[:2].mul_(3)
        return x * 2

    return cond(x.sum() > 0, t, lambda x, y: x, (x, y))


def writes_a_closure(x, y):
    def t(x):
        y[1:2].copy_(x[:1] * 10)
        return x + 1

    def f(x):
        y.sub_(x.sum())
        return x * 2

    return cond(x.sum() > 0, t, f, (x,))


def writes_through_out(x, y):
    return cond(x.sum() > 0, lambda a, b: (torch.sin(a, out=b), a + b)[1], lambda a, b: a, (x, y))


def writes_in_a_nested_branch(x, y):
    def inner(x, y):
        def deeper(x, y):
            y.add_(x)
            return x.clone()

        return cond(x.mean() > 1, deeper, lambda x, y: x * 0, (x, y)) + 1

    return cond(x.sum() > 0, inner, lambda x, y: x - 1, (x, y))


def switch_writes_different_tensors(x, y):
    def b0(x, y):
        y.fill_(7)
        return x

    def b1(x, y):
        x_plus = x + 1
        y.add_(x_plus)
        return x_plus

    def b2(x, y):
        return x * 3

    return switch(x.sum().long(), [b0, b1, b2], (x.clone(), y))


WRITERS = pytest.mark.parametrize(
    "fn",
    [
        writes_operand,
        writes_a_view,
        writes_a_closure,
        writes_through_out,
        writes_in_a_nested_branch,
        switch_writes_different_tensors,
    ],
)
# Inputs that take every branch of the functions above.
INPUTS = [
    torch.tensor([1.0, 2.0, 3.0]),  # sum 6: true (nested: true, then mean 2 > 1)
    torch.tensor([0.2, 0.3, 0.1]),  # sum 0.6: true; nested: mean 0.2, inner false; switch 0
    torch.tensor([-1.0, -2.0, 0.5]),  # sum < 0: false; switch clamps to 0
    torch.tensor([0.5, 0.5, 0.25]),  # sum 1.25: switch 1
]


def _check_against_eager(fn, run) -> None:
    """``run(x, y)`` gives ``fn``'s outputs and leaves ``y`` as the eager call does."""
    for x in INPUTS:
        y_ref, y = torch.arange(3.0), torch.arange(3.0)
        expected = fn(x, y_ref)
        torch.testing.assert_close(run(x, y), expected)
        torch.testing.assert_close(y, y_ref, msg=lambda m, x=x: f"written tensor, x={x}: {m}")


@WRITERS
@TRACING
def test_make_fx_applies_the_taken_branch_writes(fn, mode):
    y = torch.arange(3.0)
    gm = make_fx(fn, tracing_mode=mode)(INPUTS[0], y)
    if mode != "real":  # tracing on fake tensors writes nothing real
        assert torch.equal(y, torch.arange(3.0))
    # The branch graphs write nothing: every write is the enclosing graph's.
    for name, module in gm.named_modules():
        if name:
            for node in module.graph.nodes:
                if node.op == "call_function" and hasattr(node.target, "_schema"):
                    assert not node.target._schema.is_mutable, (name, node.format_node())
    _check_against_eager(fn, gm)


@WRITERS
@BACKENDS
def test_compile_applies_the_taken_branch_writes(fn, backend):
    torch._dynamo.reset()
    _check_against_eager(fn, torch.compile(fn, backend=backend, fullgraph=True))


def test_functionalized_trace_applies_the_writes():
    from functorch.compile import aot_function, nop

    for fn in (writes_operand, writes_a_view, writes_through_out):
        _check_against_eager(fn, aot_function(fn, nop))


class KVCache(torch.nn.Module):
    """A decoder-style cache written in one branch behind a data-dependent predicate."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(8, 4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x, pos, seen):
        def prefill(x, pos, seen):
            self.cache.index_copy_(0, pos, x)
            self.steps.add_(1)
            seen.add_(1)
            return x.sum(0) + self.cache.sum(0)

        def decode(x, pos, seen):
            return self.cache.sum(0) - x.sum(0)

        return cond(x.sum() > 0, prefill, decode, (x, pos, seen))


def _kv_inputs(rows: int):
    return [
        (torch.ones(rows, 4), torch.arange(rows), torch.zeros(rows)),
        (-torch.ones(rows, 4), torch.arange(rows), torch.zeros(rows)),
        (torch.full((rows, 4), 2.0), torch.arange(rows) + 1, torch.zeros(rows)),
    ]


def _check_module_against_eager(model, run, inputs) -> None:
    reference = copy.deepcopy(model)
    for x, pos, seen in inputs:
        seen_ref = seen.clone()
        expected = reference(x, pos, seen_ref)
        torch.testing.assert_close(run(x, pos, seen), expected)
        torch.testing.assert_close(seen, seen_ref)
        for (name, got), (_, want) in zip(model.named_buffers(), reference.named_buffers()):
            torch.testing.assert_close(got, want, msg=lambda m, name=name: f"{name}: {m}")


@STRICTNESS
def test_export_records_buffer_and_input_mutations(strict):
    model = KVCache()
    rows = Dim("rows", min=1, max=8)
    ep = torch.export.export(
        model,
        _kv_inputs(2)[0],
        dynamic_shapes=({0: rows}, {0: rows}, {0: rows}),
        strict=strict,
    )
    decomposed = ep.run_decompositions()
    signature = decomposed.graph_signature
    assert set(signature.buffers_to_mutate.values()) == {"cache", "steps"}
    assert set(signature.user_inputs_to_mutate.values()) == {"seen"}
    buffer = io.BytesIO()
    torch.export.save(decomposed, buffer)
    buffer.seek(0)
    for program in (ep, decomposed, torch.export.load(buffer)):
        module = program.module()
        _check_module_against_eager(module, module, _kv_inputs(3))


@BACKENDS
def test_compiled_module_updates_its_buffers(backend):
    torch._dynamo.reset()
    model = KVCache()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    _check_module_against_eager(model, compiled, _kv_inputs(2) + _kv_inputs(3))


class EarlyExit(torch.nn.Module):
    """BatchNorm in training mode in one branch: its running statistics are buffer writes."""

    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return cond(
            x.sum() > 0,
            lambda x: self.head(torch.relu(self.bn(x))),
            lambda x: self.head(x),
            (x,),
        )


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_batchnorm_in_a_branch_trains_as_eager(backend):
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = EarlyExit()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    for shift in (1.0, -3.0, 2.0):
        x = torch.randn(6, 4) + shift
        out, expected = compiled(x), reference(x)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        for (name, got), (_, want) in zip(model.named_buffers(), reference.named_buffers()):
            torch.testing.assert_close(got, want, msg=lambda m, name=name: f"{name}: {m}")
        for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
            torch.testing.assert_close(got.grad, want.grad, msg=lambda m, name=name: f"{name}: {m}")


def test_export_of_batchnorm_in_a_branch():
    model = EarlyExit()
    x = torch.randn(5, 4) + 1
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("batch", min=2)},))
    signature = ep.run_decompositions().graph_signature
    assert set(signature.buffers_to_mutate.values()) == {
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    }
    reference = copy.deepcopy(model)
    module = ep.module()
    for x in (torch.randn(7, 4) + 2, torch.randn(3, 4) - 2):
        torch.testing.assert_close(module(x), reference(x))
        torch.testing.assert_close(module.bn.running_mean, reference.bn.running_mean)


def test_gradients_through_a_writing_branch_equal_eager():
    from functorch.compile import aot_function, nop

    def f(x, w, y):
        def t(x, w, y):
            y.add_(x.detach())
            return (x * w).sin()

        return cond(x.sum() > 0, t, lambda x, w, y: x * w * 2, (x, w, y))

    for x in INPUTS[:3]:
        results = []
        for run in (f, aot_function(f, nop)):
            xs, w, y = x.clone().requires_grad_(), torch.ones(3, requires_grad=True), torch.zeros(3)
            run(xs, w, y).sum().backward()
            results.append((xs.grad, w.grad, y))
        torch.testing.assert_close(results[0], results[1])


def test_aliased_operands_cannot_both_be_traced():
    def f(x):
        def t(a, b):
            a.add_(1)
            return b * 2

        return cond(x.sum() > 0, t, lambda a, b: b, (x, x[:2]))

    x = torch.ones(3)
    with pytest.raises(
        BranchMutationError,
        match=re.escape("true_fn writes in place to operands[0], which shares memory with"),
    ):
        make_fx(f, tracing_mode="fake")(x)
    assert torch.equal(x, torch.ones(3))


def test_a_write_to_a_leaf_that_requires_grad_is_refused_as_eager_refuses_it():
    w = torch.ones(3, requires_grad=True)

    def f(x):
        def t(x):
            w.add_(1)
            return x * w

        return cond(x.sum() > 0, t, lambda x: x * 2, (x,))

    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        f(torch.ones(3))
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            torch.compile(f, backend=backend, fullgraph=True)(torch.ones(3))
    assert torch.equal(w, torch.ones(3))


@BACKENDS
def test_parameters_may_be_written_under_no_grad(backend):
    class Decay(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            def t(x):
                self.lin.weight.mul_(0.5)
                return self.lin(x)

            return cond(x.sum() > 0, t, self.lin, (x,))

    torch._dynamo.reset()
    model = Decay()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        for x in (torch.ones(3), -torch.ones(3), torch.ones(3)):
            torch.testing.assert_close(compiled(x), reference(x))
            torch.testing.assert_close(model.lin.weight, reference.lin.weight)


def _writes_and_differentiates(x, w, y):
    def t(x, w, y):
        y.add_(x.detach())
        return (x * w).sin()

    return cond(x.sum() > 0, t, lambda x, w, y: (x * w * 2).cos(), (x, w, y))


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_traced_derivatives_of_a_writing_branch_equal_eager(mode):
    import torch.autograd.forward_ad as fwAD

    def gradient(x, w, y):
        return torch.autograd.grad(_writes_and_differentiates(x, w, y).sum(), (x, w))

    def second(x, w, y):
        (g,) = torch.autograd.grad(
            _writes_and_differentiates(x, w, y).sum(), (x,), create_graph=True
        )
        return torch.autograd.grad(g.sum(), (x,))

    def forward_mode(x, w, y):
        with fwAD.dual_level():
            out = _writes_and_differentiates(fwAD.make_dual(x, torch.ones_like(x)), w, y)
            return fwAD.unpack_dual(out).tangent

    def inputs(x):
        return x.clone().requires_grad_(), torch.linspace(0.5, 1.5, 3, requires_grad=True)

    for program in (gradient, second, forward_mode):
        gm = make_fx(program, tracing_mode=mode)(*inputs(INPUTS[0]), torch.zeros(3))
        for x in INPUTS[:3]:
            y_traced, y_eager = torch.zeros(3), torch.zeros(3)
            torch.testing.assert_close(
                gm(*inputs(x), y_traced), program(*inputs(x), y_eager), msg=program.__name__
            )
            torch.testing.assert_close(y_traced, y_eager, msg=program.__name__)


@pytest.mark.parametrize("decompose", [False, True], ids=["training_ir", "decomposed"])
def test_lowered_to_select_the_written_values_are_selected(decompose):
    from torchcond.passes import lower_to_select

    model = KVCache()
    ep = torch.export.export(model, _kv_inputs(2)[0])
    if decompose:
        ep = ep.run_decompositions()
    lowered = lower_to_select(ep)
    assert "torchcond_cond" not in str(lowered.graph_module.code)
    module = lowered.module()
    _check_module_against_eager(module, module, _kv_inputs(2))


def test_select_strategy_and_per_example_vmap_select_the_written_values():
    def f(p, x, y):
        def t(x, y):
            y[:1].add_(x[:1])
            return x * 2

        return cond(p, t, lambda x, y: x + y, (x, y), strategy="select")

    for taken in (True, False):
        y_ref, y = torch.zeros(3), torch.zeros(3)
        x = torch.arange(3.0)
        expected = _python_if(taken, x, y_ref)
        torch.testing.assert_close(f(torch.tensor(taken), x, y), expected)
        torch.testing.assert_close(y, y_ref)

    flags = torch.tensor([True, False, True])
    xs, ys = torch.arange(9.0).view(3, 3), torch.zeros(3, 3)
    ys_ref = ys.clone()
    expected = torch.stack([_python_if(bool(p), x, y) for p, x, y in zip(flags, xs, ys_ref)])
    out = torch.vmap(
        lambda p, x, y: cond(
            p, lambda x, y: _python_if(True, x, y), lambda x, y: _python_if(False, x, y), (x, y)
        )
    )(flags, xs, ys)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(ys, ys_ref)


def _python_if(taken: bool, x, y):
    if taken:
        y[:1].add_(x[:1])
        return x * 2
    return x + y


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_a_branch_reads_its_own_write_through_a_closure_of_the_operand(grad):
    # While a gradient may be taken, each branch writes a copy of the operand. A read of
    # the operand through a closure must see the copy, as a Python ``if`` sees the write.
    # Under no_grad the write lands in the operand, per example under vmap.
    def f(p, x):
        def t(o):
            o.add_(10)
            return x * 1

        return cond(p, t, lambda o: x * 2, (x,), strategy="select")

    with torch.set_grad_enabled(grad):
        for taken in (True, False):
            x = torch.arange(3.0)
            out = f(torch.tensor(taken), x)
            want = torch.arange(3.0) + 10 if taken else torch.arange(3.0) * 2
            torch.testing.assert_close(out, want)
            torch.testing.assert_close(x, want if taken else torch.arange(3.0))
        xs = torch.stack([torch.arange(3.0), torch.arange(3.0) + 100])
        out = torch.vmap(f)(torch.tensor([True, False]), xs)
    torch.testing.assert_close(
        out, torch.stack([torch.arange(3.0) + 10, (torch.arange(3.0) + 100) * 2])
    )
    torch.testing.assert_close(xs, torch.stack([torch.arange(3.0) + 10, torch.arange(3.0) + 100]))


def test_a_write_read_back_through_a_closed_over_view_of_the_operand_is_refused():
    # The written copy is not what the view shows, so the branch is refused, and the
    # operand keeps its value. Under no_grad the write lands in place and the view sees it.
    x = torch.arange(3.0)
    view = x[1:]

    def t(o):
        o.add_(10)
        return view * 1

    with pytest.raises(
        BranchMutationError,
        match=r"true_fn writes in place to operands\[0\] and reads its memory through a tensor of shape \(2,\)",
    ):
        cond(torch.tensor(True), t, lambda o: o[1:] * 2, (x,), strategy="select")
    torch.testing.assert_close(x, torch.arange(3.0))
    with torch.no_grad():
        out = cond(torch.tensor(True), t, lambda o: o[1:] * 2, (x,), strategy="select")
    torch.testing.assert_close(out, torch.tensor([11.0, 12.0]))
    # A branch that only reads the view, beside one that writes, reads the old values.
    x = torch.arange(3.0)
    view = x[1:]
    out = cond(
        torch.tensor(False), lambda o: o.add_(10)[1:], lambda o: view * 2, (x,), strategy="select"
    )
    torch.testing.assert_close(out, torch.tensor([2.0, 4.0]))
    torch.testing.assert_close(x, torch.arange(3.0))


def test_a_predicate_that_views_an_operand_the_branch_writes_is_kept_for_the_backward():
    # The backward reads the predicate as it was when the conditional was called, as a
    # Python ``if`` read it before the branch wrote.
    def f(m, y):
        return cond(
            m[0],
            lambda m, y: (m.logical_not_(), y * 2)[1],
            lambda m, y: y * 3,
            (m, y),
            strategy="select",
        )

    for taken in (True, False):
        m, y = torch.tensor([taken, False]), torch.tensor([1.0, 2.0], requires_grad=True)
        f(m, y).sum().backward()
        torch.testing.assert_close(y.grad, torch.full((2,), 2.0 if taken else 3.0))
        assert m.tolist() == ([False, True] if taken else [False, False])
    ms = torch.tensor([[True, False], [False, False]])
    y = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    torch.vmap(f)(ms, y).sum().backward()
    torch.testing.assert_close(y.grad, torch.tensor([[2.0, 2.0], [3.0, 3.0]]))
    assert ms.tolist() == [[False, True], [False, False]]


def test_a_sparse_operand_beside_one_that_needs_a_gradient_runs_under_select():
    # The storage tests of the select path skip a tensor without a storage.
    x, y = torch.eye(3).to_sparse(), torch.ones(3, requires_grad=True)
    out = cond(
        torch.tensor(True), lambda x, y: x @ y, lambda x, y: y * 2, (x, y), strategy="select"
    )
    out.sum().backward()
    torch.testing.assert_close(y.grad, torch.ones(3))


SHAPE_CHANGES = {
    "unsqueeze_": lambda x: x.unsqueeze_(0),
    "t_": lambda x: x.t_(),
    "resize_": lambda x: x.resize_(6),
    "as_strided_": lambda x: x.as_strided_((3, 2), (1, 3)),
    "detach_": lambda x: x.detach_(),
}


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("change", list(SHAPE_CHANGES))
def test_a_change_of_an_operands_shape_in_place_is_refused_where_every_branch_runs(change, grad):
    # Only values are selected per branch, so the untaken branch's new shape would stay.
    def t(x):
        return SHAPE_CHANGES[change](x).sum()

    x = torch.arange(6.0).reshape(2, 3)
    with (
        torch.set_grad_enabled(grad),
        pytest.raises(
            BranchMutationError,
            match=r"true_fn writes in place \(aten\..*\) to the shape, strides or storage of its input operands\[0\]",
        ),
    ):
        cond(torch.tensor(False), t, lambda x: x.sum() * 0, (x,), strategy="select")
    assert x.shape == (2, 3) and x.stride() == (3, 1)
    xs = torch.arange(12.0).reshape(2, 2, 3)
    with (
        torch.set_grad_enabled(grad),
        pytest.raises(BranchMutationError, match="shape, strides or storage"),
    ):
        torch.vmap(lambda p, x: cond(p, t, lambda x: x.sum() * 0, (x,)))(
            torch.tensor([False, True]), xs
        )
    assert xs.shape == (2, 2, 3)
    # A tensor the branch made is its own to reshape in place.
    out = cond(
        torch.tensor(True),
        lambda x: (x * 1).unsqueeze_(0),
        lambda x: (x * 2).unsqueeze_(0),
        (x,),
        strategy="select",
    )
    torch.testing.assert_close(out, x.unsqueeze(0))


# Changes of an operand that no op makes. Each returns the branch's output.
STATE_CHANGES = {
    "requires_grad_": lambda x: (x.requires_grad_(), x * 2)[1],
    ".grad =": lambda x: (setattr(x, "grad", torch.full_like(x, 5.0)), x * 2)[1],
    "register_hook": lambda x: (x.register_hook(lambda g: g * 100), x * 2)[1],
    "register_post_accumulate_grad_hook": lambda x: (
        x.register_post_accumulate_grad_hook(lambda t: (t.grad.mul_(100), None)[1]),
        x * 2,
    )[1],
    ".data =": lambda x: (setattr(x, "data", torch.full((3,), 7.0)), x * 2)[1],
}


class _Subclass(torch.Tensor):
    """A tensor subclass operand. Its branches are recorded through a dispatch mode."""


@pytest.mark.parametrize("kind", [torch.Tensor, _Subclass], ids=["tensor", "subclass"])
@pytest.mark.parametrize("change", list(STATE_CHANGES))
def test_a_change_of_an_operands_autograd_state_is_refused_where_every_branch_runs(change, kind):
    # An untaken branch's hook or .data would stay, and change later values.
    x = torch.ones(3).as_subclass(kind).requires_grad_(change != "requires_grad_")
    kept = x.register_hook(lambda g: g * 3) if x.requires_grad else None
    data = x.data
    with (
        torch.no_grad(),
        pytest.raises(
            BranchMutationError,
            match=rf"false_fn writes in place \({re.escape(change)}\) to the state of its input "
            r"operands\[0\] that no op changes",
        ),
    ):
        cond(torch.tensor(True), lambda x: x * 3, STATE_CHANGES[change], (x,), strategy="select")
    assert x.grad is None and x.data.data_ptr() == data.data_ptr() and x.shape == (3,)
    torch.testing.assert_close(x.detach().as_subclass(torch.Tensor), torch.ones(3))
    if x.requires_grad:
        (x * 1).sum().backward()  # only the hook registered before the call runs
        torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), torch.full((3,), 3.0))
        kept.remove()
        x.grad = None
        (x * 1).sum().backward()  # its handle still removes it
        torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), torch.ones(3))
    else:
        assert not x.requires_grad


# A tensor that branches name as a global.
_GLOBAL = torch.ones(3)


def _run_every_branch(how: str, t, f, x):
    """cond(True, t, f) where every branch runs: select with or without a gradient, a
    make_fx trace, or vmap with a per-example predicate (True, then False)."""
    p = torch.tensor(True)
    if how == "trace":
        return make_fx(lambda p, x: cond(p, t, f, (x,)))(p, x)
    with torch.set_grad_enabled(how in ("select", "vmap")):
        if how.startswith("vmap"):
            return torch.vmap(lambda p, x: cond(p, t, f, (x,)))(
                torch.tensor([True, False]), torch.stack([x, x])
            )
        return cond(p, t, f, (x,), strategy="select")


def _changing(where: str, change: str):
    """A branch that changes a tensor it closes over (w) or names as a global (_GLOBAL),
    and that tensor, which requires grad unless the change is requires_grad_."""
    w = torch.ones(3) if where == "closure" else _GLOBAL
    w.requires_grad_(change != "requires_grad_")
    if where == "closure":
        return (lambda x: STATE_CHANGES[change](w) * x), w
    return (lambda x: STATE_CHANGES[change](_GLOBAL) * x), w


def _refusal(label: str, name: str | None, change: str, shape: tuple) -> str:
    """The start of the refusal of ``label``'s change of a tensor from outside it."""
    subject = (
        f"{name}, a tensor outside it,"
        if name
        else re.escape(f"a tensor of shape {shape}, torch.float32, on cpu, from outside it,")
    )
    return rf"{label} changes {subject} through {re.escape(change)}"


@pytest.mark.parametrize("how", ["select", "select_no_grad", "trace"])
@pytest.mark.parametrize("change", list(STATE_CHANGES))
@pytest.mark.parametrize("where", ["closure", "global"])
@pytest.mark.parametrize("taken", [True, False], ids=["taken", "untaken"])
def test_a_change_of_a_closed_over_tensors_autograd_state_is_refused_where_every_branch_runs(
    taken, where, change, how
):
    # As for an operand: the untaken branch's change would stay, unlike a Python `if`'s.
    # With a gradient, a branch reads a masked stand-in of a tensor that requires grad,
    # where the taken branch's change would be lost.
    f, w = _changing(where, change)
    kept = w.register_hook(lambda g: g * 3) if w.requires_grad else None
    data = w.data
    # Only the watch of the branch's code knows the tensor's name. It sees the change
    # where the branch reads the tensor itself, not a stand-in.
    stand_in = how == "select" and w.requires_grad
    name = None if stand_in else "w" if where == "closure" else "_GLOBAL"
    label = "true_fn" if taken else "false_fn"
    branches = (f, lambda x: x * 3) if taken else (lambda x: x * 3, f)
    try:
        with pytest.raises(BranchMutationError, match=_refusal(label, name, change, (3,))):
            _run_every_branch(how, *branches, torch.ones(3))
        assert w.grad is None and w.data.data_ptr() == data.data_ptr()
        torch.testing.assert_close(w.detach(), torch.ones(3))
        assert w.requires_grad == (change != "requires_grad_")
        if w.requires_grad:
            (w * 1).sum().backward()  # only the hook registered before the call runs
            torch.testing.assert_close(w.grad, torch.full((3,), 3.0))
    finally:
        if kept is not None:
            kept.remove()
        _GLOBAL.grad = None
        _GLOBAL.requires_grad_(False)


@pytest.mark.parametrize(
    "how, change",
    [
        (how, change)
        for how in ("select", "select_no_grad", "trace", "vmap", "vmap_no_grad")
        for change in STATE_CHANGES
        # torch.vmap refuses requires_grad_ itself.
        if not (how.startswith("vmap") and change == "requires_grad_")
    ],
)
@pytest.mark.parametrize("taken", [True, False], ids=["true_fn", "false_fn"])
def test_a_change_of_a_module_parameters_autograd_state_is_refused_where_every_branch_runs(
    taken, how, change
):
    # The branch reaches the parameter through a module it closes over, not by a name
    # of its own, as weight clipping does with lin.weight.data = ...
    lin = torch.nn.Linear(3, 3)
    weight = lin.weight
    weight.requires_grad_(change != "requires_grad_")
    before = weight.detach().clone()
    data = weight.data

    def changing(x):
        return STATE_CHANGES[change](lin.weight)[0] * x

    stand_in = how in ("select", "vmap") and weight.requires_grad
    label = "true_fn" if taken else "false_fn"
    branches = (changing, lambda x: x * 3) if taken else (lambda x: x * 3, changing)
    with pytest.raises(
        BranchMutationError,
        match=_refusal(label, None if stand_in else "lin.weight", change, (3, 3)),
    ):
        _run_every_branch(how, *branches, torch.ones(3))
    assert lin.weight is weight and weight.grad is None and not weight._backward_hooks
    assert not weight._post_accumulate_grad_hooks and weight.data.data_ptr() == data.data_ptr()
    assert weight.requires_grad == (change != "requires_grad_")
    torch.testing.assert_close(weight.detach(), before)


class _Holder:
    """A user object that holds a tensor."""

    def __init__(self, w):
        self.w = w


class _HoldingModule(torch.nn.Module):
    """A module that holds a tensor as a plain attribute, neither buffer nor parameter."""

    def __init__(self, w):
        super().__init__()
        self.w = w


# How a branch reaches a tensor that is not a variable of its own: the holder, the
# tensor in it, and the name the refusal gives it.
HOLDERS = {
    "object attribute": (lambda w: _Holder(w), lambda h: h.w, "holder.w"),
    "module attribute": (lambda w: _HoldingModule(w), lambda h: h.w, "holder.w"),
    "list item": (lambda w: [torch.zeros(1), w], lambda h: h[1], "holder[1]"),
    "tuple item": (lambda w: (w,), lambda h: h[0], "holder[0]"),
    "dict item": (lambda w: {"w": w}, lambda h: h["w"], "holder['w']"),
    "list in an attribute": (lambda w: _Holder([w]), lambda h: h.w[0], "holder.w[0]"),
}


@pytest.mark.parametrize("how", ["select_no_grad", "trace"])
@pytest.mark.parametrize("change", [".grad =", "register_hook", ".data ="])
@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_change_of_a_held_tensors_autograd_state_is_refused_where_every_branch_runs(
    holder, change, how
):
    make, get, name = HOLDERS[holder]
    w = torch.ones(3, requires_grad=True)
    data = w.data
    holder = make(w)

    def changing(x):
        return STATE_CHANGES[change](get(holder)) * x

    with pytest.raises(
        BranchMutationError, match=_refusal("false_fn", re.escape(name), change, ())
    ):
        _run_every_branch(how, lambda x: x * 3, changing, torch.ones(3))
    assert w.grad is None and not w._backward_hooks and w.data.data_ptr() == data.data_ptr()
    torch.testing.assert_close(w.detach(), torch.ones(3))


@pytest.mark.parametrize("change", list(STATE_CHANGES))
def test_a_taken_branch_changes_a_closed_over_tensors_autograd_state_as_an_if_does(change):
    # Eagerly a conditional is a Python `if`: only the taken branch runs, and its change stays.
    lin = torch.nn.Linear(3, 3)
    lin.weight.requires_grad_(change != "requires_grad_")
    data = lin.weight.data

    def changing(x):
        return STATE_CHANGES[change](lin.weight)[0] * x

    for taken in (False, True):
        cond(torch.tensor(taken), changing, lambda x: x * 3, (torch.ones(3),))
        changed = (
            lin.weight.requires_grad
            if change == "requires_grad_"
            else lin.weight.grad is not None
            or bool(lin.weight._backward_hooks)
            or bool(lin.weight._post_accumulate_grad_hooks)
            or lin.weight.data.data_ptr() != data.data_ptr()
        )
        assert changed == taken


def test_an_autograd_hold_names_each_change_and_puts_it_back():
    from torchcond import _C

    with pytest.raises(TypeError, match="AutogradHold holds a tensor, not list"):
        _C.AutogradHold([1.0])
    w = torch.ones(3, requires_grad=True)
    data = w.data
    for change, fn in STATE_CHANGES.items():
        if change == "requires_grad_":
            continue
        hold = _C.AutogradHold(w)
        assert hold.changed() is None
        fn(w)
        assert hold.changed() == change and hold.put_back() == change
        assert hold.changed() is None and w.grad is None and not w._backward_hooks
        assert not w._post_accumulate_grad_hooks and w.data.data_ptr() == data.data_ptr()


def test_a_closed_over_tensors_autograd_state_may_change_between_calls():
    # The state a branch finds is read anew when it changed outside the conditional.
    w = torch.ones(3)

    def t(x):
        return x * w

    for requires_grad in (False, True, False):
        w.requires_grad_(requires_grad)
        out = cond(torch.tensor(True), t, lambda x: x * 2, (torch.ones(3),), strategy="select")
        assert out.requires_grad == requires_grad
        w.data = torch.full((3,), 2.0)
        torch.testing.assert_close(
            cond(torch.tensor(True), t, lambda x: x * 2, (torch.ones(3),), strategy="select"),
            torch.full((3,), 2.0),
            check_stride=False,
        )
        w.data = torch.ones(3)


# --- every branch runs: writes that happen only on some calls, and through views -------


def _every_branch(how: str, t, f, taken: bool, operands):
    """``cond`` run with every branch, and what a Python ``if`` gives: ``"select"`` takes
    ``taken`` for all, ``"vmap"`` over the operands' first dimension takes ``taken`` for
    the first example and the other branch for the second (``"select_no_grad"`` and
    ``"vmap_no_grad"`` the same under no_grad, where one C call runs both). The
    reference runs on copies of the operands, returned after its output."""
    refs = [o.clone() for o in operands]
    if how.startswith("select"):
        expected = t(*refs) if taken else f(*refs)
        with torch.set_grad_enabled(how == "select"):
            out = cond(torch.tensor(taken), t, f, operands, strategy="select")
    else:
        flags = [taken, not taken]
        expected = torch.stack(
            [(t if p else f)(*rows) for p, *rows in zip(flags, *refs, strict=True)]
        )
        with torch.set_grad_enabled(how == "vmap"):
            out = torch.vmap(lambda p, *xs: cond(p, t, f, xs))(torch.tensor(flags), *operands)
    return out, expected, refs


EVERY_BRANCH = pytest.mark.parametrize("how", ["select", "vmap", "select_no_grad", "vmap_no_grad"])


@EVERY_BRANCH
def test_a_branch_that_writes_on_some_calls_only_writes_where_taken(how):
    # Whether the branch writes is decided on the host, call by call: each call is
    # recorded afresh, and where the branch is not taken its write does not land.
    write = [False]

    def t(x, y):
        if write[0]:
            y.add_(x)
        return x * 2

    def f(x, y):
        return x - y

    for write[0], taken in itertools.product((False, True, False, True), (True, False)):
        x, y = torch.ones(2, 3), torch.zeros(2, 3)
        out, expected, (_, y_ref) = _every_branch(how, t, f, taken, (x, y))
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(y, y_ref)


@EVERY_BRANCH
def test_a_write_to_a_closure_on_some_calls_is_refused_on_those_calls(how):
    w, write = torch.zeros(3), [False]

    def t(x):
        if write[0]:
            w[1:].add_(1)  # through a view
        return x + 1

    def run(x):
        with torch.set_grad_enabled(not how.endswith("no_grad")):
            if how.startswith("select"):
                return cond(torch.tensor(False), t, lambda x: x.sin(), (x,), strategy="select")
            flags = torch.tensor([False, True])
            return torch.vmap(lambda p, x: cond(p, t, lambda x: x.sin(), (x,)))(flags, x)

    for write[0] in (False, True, False, True):
        x = torch.ones(2, 3)
        if not write[0]:
            out, expected, _ = _every_branch(how, t, torch.sin, False, (x,))
            torch.testing.assert_close(out, expected)
            continue
        with pytest.raises(
            BranchMutationError,
            match=r"true_fn writes in place .* from outside it \(shape \(2,\)\)",
        ):
            run(x)
        torch.testing.assert_close(w, torch.zeros(3))


class _ViewWriter(torch.nn.Module):
    """Writes to its buffer through views of it in one branch."""

    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(4, 3))

    def forward(self, p, x):
        def t(x):
            self.buf[:2].add_(x.sum())
            return x * 2

        return cond(p, t, lambda x: x + 1, (x,), strategy="select")


def test_a_write_through_a_view_of_a_buffer_the_branch_closes_over_is_refused():
    m = _ViewWriter()
    for taken in (True, False):
        with pytest.raises(
            BranchMutationError, match=r"true_fn writes in place \(aten.add_.Tensor\) to a tensor"
        ):
            m(torch.tensor(taken), torch.ones(3))
        torch.testing.assert_close(m.buf, torch.zeros(4, 3))


@EVERY_BRANCH
def test_a_write_through_a_view_of_a_buffer_operand_lands_where_taken(how):
    def t(x, buf):
        buf[1:3].mul_(2)
        buf[0, :1].add_(x.sum())
        return x * 2

    def f(x, buf):
        return x + buf[0]

    for taken in (True, False):
        x, buf = torch.ones(2, 3), torch.arange(24.0).view(2, 4, 3)
        if how.startswith("select"):
            x, buf = x[0], buf[0]
        out, expected, (_, buf_ref) = _every_branch(how, t, f, taken, (x, buf))
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(buf, buf_ref)


def test_a_write_to_memory_around_an_operand_is_refused():
    # The operand is a row of a buffer the branch also closes over: a write to another
    # row cannot be selected as the operand's value, so it is refused and nothing lands.
    buf = torch.zeros(4, 3)

    def t(row):
        buf[1].add_(1)
        return row + 1

    with pytest.raises(
        BranchMutationError,
        match=re.escape("to memory of its input operands[0]'s storage outside operands[0] itself"),
    ):
        cond(torch.tensor(False), t, torch.sin, (buf[0],), strategy="select")
    torch.testing.assert_close(buf, torch.zeros(4, 3))


def _inference_graph(model, *args) -> torch.fx.GraphModule:
    """The graph Inductor would get for ``model`` in inference: input mutations kept."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=capture, keep_inference_input_mutations=True)
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(*args)
    return graphs[0]


def test_inductor_gets_branches_that_write_in_place():
    """A written-back output becomes an in-place write again (O(row), not O(buffer))."""
    from torchcond._src.reinplace import in_place

    class RowWrite(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(16, 4))

        def forward(self, x, pos):
            def write(x, pos):
                self.cache.index_copy_(0, pos, x)
                return x * 2

            return cond(x.sum() > 0, write, lambda x, pos: x - 1, (x, pos))

    gm = _inference_graph(RowWrite(), torch.ones(1, 4), torch.tensor([3]))
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.torchcond_cond]
    branches = [getattr(gm, a.target) for a in node.args[1:3]]
    graphs, written = in_place(node, branches)
    assert written == {1: 2}  # output 1 is operand 2 (the cache), written in place
    true_ops = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.index_copy_.default in true_ops
    assert torch.ops.aten.index_copy.default not in true_ops
    for g in graphs:  # both branches now return the first output only
        assert len(g.graph.find_nodes(op="output")[0].args[0]) == 1
    assert not any(n.target is torch.ops.aten.clone.default for n in graphs[1].graph.nodes)

    # A read of the written buffer after the conditional keeps the functional form.
    class ReadAfter(RowWrite):
        def forward(self, x, pos):
            return super().forward(x, pos) + self.cache.sum()

    gm = _inference_graph(ReadAfter(), torch.ones(1, 4), torch.tensor([3]))
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.torchcond_cond]
    assert in_place(node, [getattr(gm, a.target) for a in node.args[1:3]]) is None


@pytest.mark.parametrize("read_after", [False, True])
def test_inductor_in_place_writes_equal_eager(read_after):
    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(8, 4))
            self.register_buffer("hits", torch.zeros(8))

        def forward(self, x, pos):
            def write(x, pos):
                self.cache.index_copy_(0, pos, x)
                return x * 2

            def count(x, pos):
                self.hits.index_add_(0, pos, torch.ones_like(pos, dtype=x.dtype))
                return x - self.cache.index_select(0, pos)

            out = cond(x.sum() > 0, write, count, (x, pos))
            return out + self.cache.sum() if read_after else out

    torch._dynamo.reset()
    model = Both()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    with torch.no_grad():
        for x, pos in [
            (torch.ones(2, 4), torch.tensor([1, 5])),
            (-torch.ones(2, 4), torch.tensor([1, 2])),
            (torch.full((1, 4), 3.0), torch.tensor([1])),
            (-torch.ones(3, 4), torch.tensor([0, 1, 2])),
        ]:
            torch.testing.assert_close(compiled(x, pos), reference(x, pos))
            torch.testing.assert_close(model.cache, reference.cache)
            torch.testing.assert_close(model.hits, reference.hits)


@pytest.mark.parametrize("transform", ["grad", "jvp"])
def test_torch_func_transform_of_a_writing_traced_branch_is_refused(transform):
    # Its derivative would recompute the branch from an operand the write changed;
    # torch.autograd (above) differentiates the same program correctly.
    def f(x, y):
        def t(x, y):
            y.add_(1)
            return (x * y).sin()

        return cond(x.sum() > 0, t, lambda x, y: x.cos() * y, (x, y))

    def program(x, y):
        # y is an input of the transformed function: torch.func refuses a write to a
        # tensor captured from outside it, with a Python `if` as well.
        if transform == "grad":
            return torch.func.grad(lambda x, y: f(x, y).sum())(x, y)
        return torch.func.jvp(f, (x, y), (torch.ones_like(x), torch.zeros_like(y)))[1]

    y = torch.ones(3)
    with pytest.raises(
        BranchMutationError,
        match=re.escape(
            "true_fn / false_fn writes in place to operands[1] inside a conditional that a torch.func transform"
        ),
    ):
        make_fx(program, tracing_mode="symbolic")(INPUTS[0], y)
    assert torch.equal(y, torch.ones(3))


def test_gradient_through_a_written_operand_that_the_branch_reads_equals_eager():
    from functorch.compile import aot_function, nop

    def f(x, w):
        y = w * 1  # requires grad: the write is differentiated through

        def t(x, y):
            y.add_(x)
            return (x * y).sin()

        out = cond(x.sum() > 0, t, lambda x, y: x.cos() * y, (x, y))
        return out.sum() + (y * y).sum()

    def grads(run, x):
        xs, w = x.clone().requires_grad_(), torch.linspace(1.0, 2.0, 3, requires_grad=True)
        run(xs, w).backward()
        return xs.grad, w.grad

    traced = make_fx(lambda x, w: torch.autograd.grad(f(x, w), (x, w)), tracing_mode="fake")(
        INPUTS[0].clone().requires_grad_(), torch.ones(3, requires_grad=True)
    )
    for x in INPUTS[:3]:
        expected = grads(f, x)
        torch.testing.assert_close(grads(aot_function(f, nop), x), expected)
        w = torch.linspace(1.0, 2.0, 3, requires_grad=True)
        torch.testing.assert_close(traced(x.clone().requires_grad_(), w), expected)


@STRICTNESS
def test_export_of_a_switch_whose_branches_write_different_buffers(strict):
    class Router(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("a", torch.zeros(3))
            self.register_buffer("b", torch.zeros(3))

        def forward(self, i, x):
            def first(x):
                self.a.add_(x)
                return x * 2

            def second(x):
                self.b.sub_(x)
                return x - 1

            return switch(i, [first, second, lambda x: x + self.a + self.b], (x,))

    model = Router()
    ep = torch.export.export(model, (torch.tensor(0), torch.ones(3)), strict=strict)
    signature = ep.run_decompositions().graph_signature
    assert set(signature.buffers_to_mutate.values()) == {"a", "b"}
    module, reference = ep.module(), copy.deepcopy(model)
    for i in (0, 1, 2, 1, 5, -3):
        x = torch.arange(3.0) + i
        torch.testing.assert_close(module(torch.tensor(i), x), reference(torch.tensor(i), x))
        torch.testing.assert_close(module.a, reference.a)
        torch.testing.assert_close(module.b, reference.b)


def test_torch_cond_on_the_same_work():
    """Where torch.cond handles a write, it gives what we give; where it refuses
    (a write with grad on, as in training), we still give eager's result."""
    cache = torch.zeros(4, 2)

    def kv(cond_fn, x, pos, cache):
        def write(x, pos, cache):
            cache.index_copy_(0, pos, x)
            return x * 2

        return cond_fn(x.sum() > 0, write, lambda x, pos, cache: x - 1, (x, pos, cache))

    def run(cond_fn, x):
        torch._dynamo.reset()
        c = cache.clone()
        with torch.no_grad():
            out = torch.compile(kv, backend="aot_eager", fullgraph=True)(
                cond_fn, x, torch.tensor([1]), c
            )
        return out, c

    for x in (torch.ones(1, 2), -torch.ones(1, 2)):
        ours = run(cond, x)
        c = cache.clone()
        torch.testing.assert_close(ours, (kv(cond, x, torch.tensor([1]), c), c))
        try:  # torch.cond takes an input mutation in inference from torch 2.13 on
            theirs = run(torch.cond, x)
        except torch._dynamo.exc.UncapturedHigherOrderOpError:
            continue
        torch.testing.assert_close(ours, theirs)

    torch.manual_seed(0)
    model = EarlyExit()
    x = torch.randn(6, 4) + 1
    expected = copy.deepcopy(model)(x)
    torch._dynamo.reset()
    torch.testing.assert_close(
        torch.compile(model, backend="aot_eager", fullgraph=True)(x), expected
    )


def _scale_by_written(x, buffer):
    buffer.add_(1.0)
    return x * buffer  # autograd saves the written buffer


@pytest.mark.parametrize("how", ["select", "vmap"])
def test_a_written_operand_the_gradient_reads_matches_python_if(how):
    # The branch's graph keeps the buffer it wrote: putting the operand's old value back
    # in place would change that tensor (a version error in backward, or a wrong
    # gradient). Value, write and gradient as a Python `if` gives them.
    for taken in (True, False):
        x = torch.tensor([0.5, 0.7], requires_grad=True)
        buf = torch.tensor([1.5, 1.9])
        out, expected, (_, buf_ref) = _every_branch(
            how, _scale_by_written, lambda x, b: x.cos(), taken, (x, buf)
        )
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(buf, buf_ref)
        (grad,) = torch.autograd.grad(out.sum(), x)
        x2, b = x.detach().requires_grad_(), torch.tensor([1.5, 1.9])
        if how == "select":
            want = _scale_by_written(x2, b) if taken else x2.cos()
        else:
            flags = (taken, not taken)
            want = torch.stack(
                [_scale_by_written(x2[i], b[i]) if p else x2[i].cos() for i, p in enumerate(flags)]
            )
        (grad_ref,) = torch.autograd.grad(want.sum(), x2)
        torch.testing.assert_close(grad, grad_ref)


def test_a_written_operand_under_export_matches_python_if():
    # Export's pre-dispatch trace records a write before torchcond hears of it: every
    # branch writes its own copy, and only the written one is written back.
    class M(torch.nn.Module):
        def forward(self, x, buf, p):
            return cond(p, _scale_by_written, lambda x, b: x.cos(), (x, buf), strategy="select")

    args = (torch.tensor(0.5), torch.tensor(1.5), torch.tensor(True))
    m = torch.export.export(M(), args, strict=False).module()
    for taken in (True, False):
        x, buf, ref = torch.tensor(0.8), torch.tensor(1.7), torch.tensor(1.7)
        expected = _scale_by_written(x, ref) if taken else x.cos()
        torch.testing.assert_close(m(x, buf, torch.tensor(taken)), expected)
        torch.testing.assert_close(buf, ref)


# Hooks a branch may register on a tensor from outside it. Each returns nothing.
HOOKS = {
    "register_hook": lambda t: t.register_hook(lambda g: g * 100),
    "register_post_accumulate_grad_hook": lambda t: t.register_post_accumulate_grad_hook(
        lambda p: None
    ),
}


@pytest.mark.parametrize("strategy", ["auto", "select"])
@pytest.mark.parametrize("where", ["closure", "operand", "parameter"])
@pytest.mark.parametrize("hook", list(HOOKS))
def test_a_hook_that_a_compiled_branch_registers_is_refused(hook, where, strategy):
    # Dynamo keeps a subgraph's hook on such a tensor nowhere, so even the taken
    # branch's hook would be lost, where a Python `if` registers it.
    lin = torch.nn.Linear(3, 3)
    w = torch.ones(3, requires_grad=True)
    x = torch.ones(3, requires_grad=True)
    held = {"closure": w, "operand": x, "parameter": lin.weight}[where]
    name = {"closure": "w", "operand": "x", "parameter": "lin.weight"}[where]

    def hooked(x):
        if where == "closure":
            HOOKS[hook](w)
        elif where == "operand":
            HOOKS[hook](x)
        else:
            HOOKS[hook](lin.weight)
        return x * 2

    f = torch.compile(
        lambda p, x: cond(p, hooked, lambda x: x * 3, (x,), strategy=strategy),
        backend="eager",
        fullgraph=True,
    )
    with pytest.raises(
        BranchMutationError,
        match=rf"true_fn changes {re.escape(name)}, a tensor outside it, through {hook}",
    ):
        f(torch.tensor(True), x)
    assert not held._backward_hooks and not held._post_accumulate_grad_hooks
    cond(torch.tensor(True), hooked, lambda x: x * 3, (x,))  # eagerly a Python `if`
    assert held._backward_hooks or held._post_accumulate_grad_hooks


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_branch_gives_a_tensor_new_data_as_an_if_does_or_is_refused(backend):
    # Dynamo's graph runs x.data = y as set_, so only the taken branch's lands. A
    # functionalized branch has no such op, and the new data would be lost.
    w = torch.ones(3)

    def clip(x):
        w.data = w.data.clamp(max=0.5)
        return x + 1

    f = torch.compile(lambda p, x: cond(p, clip, lambda x: x * 2, (x,)), backend=backend)
    if backend == "aot_eager":
        with pytest.raises(Exception, match=r"true_fn gives its input .* new storage in place"):
            f(torch.tensor(True), torch.ones(3))
        torch.testing.assert_close(w, torch.ones(3))
        return
    f(torch.tensor(False), torch.ones(3))
    torch.testing.assert_close(w, torch.ones(3))
    f(torch.tensor(True), torch.ones(3))
    torch.testing.assert_close(w, torch.full((3,), 0.5))
