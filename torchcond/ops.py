"""The operators ``torchcond_cond`` and ``torchcond_switch`` and their dispatch rules.

Both are one conditional over N branches, called as ``op(selector, *branches,
operands)``; they differ in how the selector picks a branch and how graphs are named
(see ``_Form``). Each dispatch key has one rule below, written once for N branches and
installed on both operators.

Operator contract (what the rules receive): ``operands`` is a flat tuple of tensors
(and SymInts once closures are lifted); every branch takes ``*operands`` and returns a
flat tuple of tensors. ``api.py`` builds that from the user's pytrees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import _compat
from ._compat import DispatchKey, FakeTensorMode, ProxyTorchDispatchMode, pytree
from ._compat import dynamo as _compat_dynamo
from ._compat import export as _compat_export
from .errors import CondArgumentError, UnsupportedCondError
from .merge import merge_branch_outputs
from .subgraph import output_values
from .tracing import branch_specs, check_same_structure, leaf_paths, trace_branches


class CondOp(_compat.HigherOrderOperator):
    """``torchcond_cond(pred, true_graph, false_graph, operands)``."""

    def __init__(self):
        super().__init__("torchcond_cond")

    def __call__(self, pred, true_fn, false_fn, operands):
        return super().__call__(pred, true_fn, false_fn, operands)


class SwitchOp(_compat.HigherOrderOperator):
    """``torchcond_switch(index, branch_graph_0, ..., branch_graph_n, operands)``.

    Branches are positional, not one tuple: torch.export's serialization schema has
    an argument kind for a graph but none for a list of graphs.
    """

    def __init__(self):
        super().__init__("torchcond_switch")

    def __call__(self, index, *branches_then_operands):
        return super().__call__(index, *branches_then_operands)


cond_op = CondOp()
switch_op = SwitchOp()


class _Form:
    """What differs between the operators: branch choice, labels, graph names."""

    def __init__(self, op, taken, labels, graph_names):
        self.op = op
        self.taken: Callable[[object, int], int] = taken
        self.labels: Callable[[int], list[str]] = labels
        self.graph_names: Callable[[torch.nn.Module, int], list[str]] = graph_names


def clamp_index(index: int, n: int) -> int:
    return min(max(index, 0), n - 1)


def _free_name(root: torch.nn.Module, prefix: str, start: int = 0) -> int:
    i = start
    while hasattr(root, f"{prefix}_{i}"):
        i += 1
    return i


def _cond_graph_names(root, n):
    i = 0
    while hasattr(root, f"true_graph_{i}") or hasattr(root, f"false_graph_{i}"):
        i += 1
    return [f"true_graph_{i}", f"false_graph_{i}"]


def _switch_graph_names(root, n):
    names, i = [], 0
    for _ in range(n):
        i = _free_name(root, "branch_graph", i)
        names.append(f"branch_graph_{i}")
        i += 1
    return names


_FORMS = {
    cond_op: _Form(
        cond_op,
        taken=lambda pred, n: 0 if pred else 1,
        labels=lambda n: ["true_fn", "false_fn"],
        graph_names=_cond_graph_names,
    ),
    switch_op: _Form(
        switch_op,
        taken=lambda index, n: clamp_index(int(index), n),
        labels=lambda n: [f"branches[{i}]" for i in range(n)],
        graph_names=_switch_graph_names,
    ),
}


def _unpack(args: tuple) -> tuple:
    """``(selector, *branches, operands)`` -> ``(selector, branches, operands)``."""
    return args[0], args[1:-1], args[-1]


def _pack(selector, branches: Sequence, operands: tuple) -> tuple:
    return (selector, *branches, operands)


# --- one rule per dispatch key -----------------------------------------------------


def _dense(form: _Form, selector, branches, operands):
    """Real tensors: run the taken branch. Meta predicates cannot be read: merge all."""
    if isinstance(selector, torch.Tensor) and selector.device.type == "meta":
        real = [t.device for t in operands if isinstance(t, torch.Tensor) and t.device.type != "meta"]
        if real:
            raise CondArgumentError(
                f"{form.op.name()}: the selector is a meta tensor, so no branch can be "
                f"chosen, but operands are real tensors (on {real[0]}); put the "
                "selector on their device, or make every operand a meta tensor"
            )
        return _all_branches_merged(form, branches, operands, shape_env=None)
    return branches[form.taken(selector, len(branches))](*operands)


def _autograd(form: _Form, selector, branches, operands):
    """Concrete predicate: the taken branch under ordinary autograd (any order).

    A symbolic or fake predicate (tracing, compile) gets outputs that trace fine
    forward; their backward refuses until the backward-as-a-cond lands.
    """
    if not (torch.is_grad_enabled() and _any_requires_grad(operands)):
        return _below_autograd(form, selector, branches, operands)
    if is_concrete(selector):
        return branches[form.taken(selector, len(branches))](*operands)
    return _TracedBackwardRefused.apply(form, selector, branches, *operands)


class _TracedBackwardRefused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, form, selector, branches, *operands):
        ctx.op_name = form.op.name()
        ctx.selector_type = type(selector).__name__
        return _below_autograd(form, selector, branches, operands)

    @staticmethod
    def backward(ctx, *grads):
        raise UnsupportedCondError(
            f"{ctx.op_name}: backward through a conditional whose selector is symbolic "
            f"or fake ({ctx.selector_type}) is not supported yet; differentiate in eager "
            "mode (a Python `if` there), or run the traced program under torch.no_grad()"
        )


def _below_autograd(form: _Form, selector, branches, operands):
    with _compat.below_autograd():
        return form.op(*_pack(selector, branches, operands))


def _fake(form: _Form, mode: FakeTensorMode, selector, branches, operands):
    """The selector is unknown: run every branch on fake tensors and merge."""
    with mode, _compat.ignore_fresh_unbacked(mode):
        return _all_branches_merged(form, branches, operands, mode.shape_env)


def _proxy(form: _Form, mode: ProxyTorchDispatchMode, selector, branches, operands):
    """One graph node whose branches are closure-free registered subgraphs."""
    tracer = mode.tracer
    labels = form.labels(len(branches))
    graphs, operands = trace_branches(tracer, branches, tuple(operands), labels)
    if not output_values(graphs[0]):
        # Branches that may not mutate their inputs and return nothing have no effect:
        # checked and traced, but nothing to record.
        return ()
    for name, gm in zip(form.graph_names(tracer.root, len(graphs)), graphs):
        tracer.root.register_module(name, gm)
    args = _pack(selector, graphs, operands)
    proxy_args = pytree.tree_map(tracer.unwrap_proxy, args)
    out_proxy = tracer.create_proxy("call_function", form.op, proxy_args, {})
    out = _below_autograd(form, selector, graphs, operands)
    return _compat.track_tensor_tree(out, out_proxy, constant=None, tracer=tracer)


def _functionalize(form: _Form, ctx, selector, branches, operands):
    """Branches run functionalized; a write to an input shows up as a copy_ and is refused."""
    inner_operands = ctx.unwrap_tensors(operands)
    inner_selector = ctx.unwrap_tensors(selector) if isinstance(selector, torch.Tensor) else selector
    with ctx.redispatch_to_next():
        functional = [
            SpecCarrier(ctx.functionalize(_compat.run_with_interpreter(b)), b)
            for b in branches
        ]
        out = form.op(*_pack(inner_selector, functional, inner_operands))
    return ctx.wrap_tensors(out)


def _functorch(form: _Form, interpreter, selector, branches, operands):
    """torch.func transforms (e.g. over an exported program): a Python `if` when readable.

    The taken branch runs on the transform's wrapped tensors, so grad/jvp/vmap apply
    to it as they would to the same code written with `if`.
    """
    if is_concrete(selector):
        return branches[form.taken(selector, len(branches))](*operands)
    transform = interpreter.key().name.lower()
    if isinstance(selector, torch.Tensor) and _compat.is_vmapped(selector):
        why = "the selector is batched (one value per example), which needs a device-side select"
    else:
        why = f"the selector is symbolic or traced ({type(selector).__name__})"
    raise UnsupportedCondError(
        f"{form.op.name()}: torch.func {transform} over this conditional is not supported "
        f"yet: {why}"
    )


# --- helpers -------------------------------------------------------------------------


class SpecCarrier:
    """A wrapped branch that still reports the output structure its origin recorded."""

    def __init__(self, fn, origin):
        self.fn = fn
        self.origin = origin
        self.__name__ = getattr(origin, "__name__", "branch")

    def __call__(self, *args):
        return self.fn(*args)

    @property
    def out_spec(self):
        return branch_specs([self.origin])[0]


def _all_branches_merged(form, branches, operands, shape_env):
    labels = form.labels(len(branches))
    outs = [tuple(b(*operands)) for b in branches]
    check_same_structure(branches, labels)
    specs = [s for s in branch_specs(branches) if s is not None]
    paths = leaf_paths(specs[0] if specs else None, len(outs[0]))
    return merge_branch_outputs(outs, labels, paths, shape_env)


def _any_requires_grad(operands) -> bool:
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in operands)


def is_concrete(selector) -> bool:
    """Readable on the host right now: no tracing active, a real tensor or a number.

    Under a tracing mode the Autograd key runs before the mode's rule; reading the
    selector there would inline one branch into the trace, so it never counts.
    """
    if _compat.tracing():
        return False
    if isinstance(selector, torch.Tensor):
        if _compat.is_functorch_wrapped(selector):
            if _compat.is_vmapped(selector):
                return False
            selector = _compat.functorch_base(selector)
        return type(selector) is torch.Tensor and selector.device.type != "meta"
    return isinstance(selector, (bool, int))


def _install(form: _Form) -> None:
    op = form.op

    @op.py_impl(DispatchKey.CompositeExplicitAutograd)
    def dense(*args):
        return _dense(form, *_unpack(args))

    @op.py_autograd_impl
    def autograd(*args):
        return _autograd(form, *_unpack(args))

    @op.py_impl(FakeTensorMode)
    def fake(mode, *args):
        return _fake(form, mode, *_unpack(args))

    @op.py_impl(ProxyTorchDispatchMode)
    def proxy(mode, *args):
        return _proxy(form, mode, *_unpack(args))

    @op.py_functionalize_impl
    def functionalize(ctx, *args):
        return _functionalize(form, ctx, *_unpack(args))

    for transform in _compat.FUNCTORCH_TRANSFORMS:

        @op.py_impl(transform)
        def functorch(interpreter, *args):
            return _functorch(form, interpreter, *_unpack(args))


for _form in _FORMS.values():
    _install(_form)

_compat_dynamo.install({form.op: form.taken for form in _FORMS.values()})
_compat_export.install(frozenset(form.op.name() for form in _FORMS.values()))
