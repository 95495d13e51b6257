"""The operators ``torchcond_cond`` and ``torchcond_switch`` and their dispatch rules.

Both are one conditional over N branches, called as ``op(selector, *branches,
operands)``. They differ in how the selector picks a branch and how graphs are named
(see ``kinds.ConditionalKind``). Each dispatch key has one rule below. Each rule is
written once for N branches and installed on both operators.

The rules rely on this operator contract. ``operands`` is a flat tuple of tensors, plus
SymInts once closures are lifted. Every branch takes ``*operands`` and returns a flat
tuple of tensors. ``api.py`` builds these from the user's pytrees.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _compat
from .._compat import (
    DispatchKey,
    FakeTensorMode,
    FlopCounterDispatchMode,
    ProxyTorchDispatchMode,
    pytree,
)
from .._compat import dynamo as _compat_dynamo
from .._compat import export as _compat_export
from .._compat import inductor as _compat_inductor
from .._compat import onnx as _compat_onnx
from ..errors import CondArgumentError, CondError, UnsupportedCondError
from . import distributed, numbers, state
from .autograd import autograd_rule, functorch_rule, with_tangents
from .batching import per_example, vmap_rule
from .closures import trace_in_session
from .host import TRANSFORM, host_readable
from .kinds import (
    COND_NAME,
    SWITCH_NAME,
    ConditionalKind,
    cond_kind,
    pack,
    switch_kind,
    unpack,
)
from .merge import check_agreement, merge_branch_outputs
from .modes import (
    USER_MODES,
    flop_rule,
    python_key_rule,
    takes_first,
    top_kind,
)
from .modes import autograd_rule as modes_autograd_rule
from .pytrees import raise_named
from .reinplace import in_place
from .strategies import run_all_and_select
from .subgraph import output_values
from .to_onnx import translations as onnx_translations
from .tracing import (
    functionalized_writing_back,
    pending_writes,
    plain,
    pretraced,
    refuse_writes_under_transform,
    returning_writes,
    trace_branches,
    writes_of,
    written_back,
)
from .untraced import labelled_inputs, refuse_untraced, refuse_wrapped_in_export

# A keyword's default: not given.
_UNSET: Any = object()


class _ConditionalOp(_compat.HigherOrderOperator):
    def _call(self, args: tuple, may_write, speculate_only, closures_read_as):
        """Call the operator. The keywords are read only by dynamo's view of it
        (_compat/dynamo.py), while dynamo traces the call, which never reaches here."""
        given = [
            name
            for name, value in (
                ("may_write", may_write),
                ("speculate_only", speculate_only),
                ("closures_read_as", closures_read_as),
            )
            if value is not _UNSET
        ]
        if given:
            raise TypeError(
                f"{self.name()}: the keywords {', '.join(given)} are read only "
                "while dynamo traces the call"
            )
        return super().__call__(*args)

    def dispatch(self, /, dispatch_key, *args, **kwargs):
        # torch finds a mode's rule by the mode's exact type, so a user's mode would
        # have none. modes.py has one rule for all of them.
        if dispatch_key == DispatchKey.Python and top_kind(self) in USER_MODES:
            return python_key_rule(kind_of(self), *unpack(args))
        return super().dispatch(dispatch_key, *args, **kwargs)


class CondOp(_ConditionalOp):
    """``torchcond_cond(pred, true_graph, false_graph, operands)``."""

    def __init__(self):
        super().__init__(COND_NAME)

    # HigherOrderOperator.__call__ is abstract, so each operator states its signature.
    # The keywords are dynamo's: may_write=False refuses branch writes to anything from
    # outside them, speculate_only=True checks the branches and emits no node, and
    # closures_read_as is how a closure-reading mode reads closed-over tensors
    # (api._operator_under_dynamo, closures.StandIns).
    def __call__(
        self,
        pred,
        true_fn,
        false_fn,
        operands,
        *,
        may_write=_UNSET,
        speculate_only=_UNSET,
        closures_read_as=_UNSET,
    ):
        args = (pred, true_fn, false_fn, operands)
        return self._call(args, may_write, speculate_only, closures_read_as)


class SwitchOp(_ConditionalOp):
    """``torchcond_switch(index, branch_graph_0, ..., branch_graph_n, operands)``.

    The branches are positional, not one tuple. torch.export's serialization schema
    has an argument kind for a graph but none for a list of graphs.
    """

    def __init__(self):
        super().__init__(SWITCH_NAME)

    def __call__(
        self,
        index,
        *branches_then_operands,
        may_write=_UNSET,
        speculate_only=_UNSET,
        closures_read_as=_UNSET,
    ):
        args = (index, *branches_then_operands)
        return self._call(args, may_write, speculate_only, closures_read_as)


cond_op = CondOp()
switch_op = SwitchOp()


_KINDS = {cond_op: cond_kind(cond_op), switch_op: switch_kind(switch_op)}


def kind_of(op) -> ConditionalKind:
    return _KINDS[op]


# --- one rule per dispatch key -----------------------------------------------------


def _dense(kind: ConditionalKind, selector, branches, operands):
    """Run the taken branch on real tensors. A meta selector cannot be read, so every
    branch runs and their outputs are merged."""
    if isinstance(selector, torch.Tensor) and selector.device.type == "meta":
        real = [
            t.device for t in operands if isinstance(t, torch.Tensor) and t.device.type != "meta"
        ]
        if real:
            raise CondArgumentError(
                f"{kind.op.name()}: the selector is a meta tensor, so no branch can be "
                f"chosen, but operands are real tensors (on {real[0]}); put the "
                "selector on their device, or make every operand a meta tensor"
            )
        return _all_branches_merged(kind, branches, operands, shape_env=None)
    return kind.taken_branch(selector, branches)(*operands)


def _fake(kind: ConditionalKind, mode: FakeTensorMode, selector, branches, operands):
    """Run every branch on fake tensors and merge the outputs, as the selector is unknown."""
    if _subclass_rule(kind.op, (selector, *operands)) is not None:
        return NotImplemented  # e.g. DTensors, whose rule (distributed.py) runs on locals
    with mode:
        # Unbacked sizes inside a branch belong to the subgraph. The merged sizes are
        # fresh symbols of this node, so the tracer records where they come from.
        facts = kind.branch_facts(selector, len(branches))
        labels = kind.labels(len(branches))
        with _compat.ignore_fresh_unbacked(mode), state.every_branch_runs():
            outs = []
            for b, f, label in zip(branches, facts, labels):
                # The branch's graph holds its checks already; they are not kept here.
                with _compat.assuming(mode.shape_env, f, label) as assumed:
                    outs.append(tuple(b(*assumed.specialized(operands))))
        outside = _compat.unbacked_symbols(operands)
        return _merged(kind, branches, outs, mode.shape_env, outside)


def _subclass_rule(op, values):
    """Return ``op``'s rule for a tensor subclass among ``values`` (DTensor), or None."""
    for v in values:
        if isinstance(v, torch.Tensor) and type(v) in op.python_key_table:
            return op.python_key_table[type(v)]
    return None


def _refuse_subclass_training(kind: ConditionalKind, selector, operands) -> None:
    """Refuse AOTAutograd's joint trace over tensor subclasses with their own rule.

    That trace (torch.compile with gradients) over a subclass such as DTensor would
    differentiate the branches while its tracer holds only the inner tensors. A named
    refusal is clearer than a failure deep inside."""
    if not torch.is_grad_enabled() or _compat.functional_mode() is None:
        return
    if host_readable(selector):
        return
    if _subclass_rule(kind.op, (selector, *operands)) is None:
        return
    kinds = sorted({type(t).__name__ for t in operands if type(t) in kind.op.python_key_table})
    raise UnsupportedCondError(
        f"{kind.name}: differentiating a traced conditional over {', '.join(kinds)} operands "
        "(torch.compile or AOTAutograd with gradients) is not supported yet; compile "
        "under torch.no_grad(), or run the conditional eagerly (a Python if)"
    )


def _proxy(kind: ConditionalKind, mode: ProxyTorchDispatchMode, selector, branches, operands):
    """Record one graph node whose branches are closure-free registered subgraphs."""
    # The make_fx tracer is a PythonKeyTracer, which has .root and .unwrap_proxy.
    tracer: Any = mode.tracer
    n_given = len(operands)
    found = pretraced(branches, tracer)
    if found is None:  # not traced in this session yet
        traced = trace_branches(
            tracer,
            branches,
            tuple(operands),
            kind.labels(len(branches)),
            facts=kind.branch_facts(selector, len(branches)),
        )
        graphs, operands, written = traced.graphs, traced.operands, traced.written
    else:
        graphs, written = found
    refuse_untraced(kind.name, labelled_inputs(selector, operands, n_given), tracer)
    if _compat.fake_mode_of(operands) is None:
        # With real tensors, the node's value below comes from the taken branch alone.
        # So check here that every branch's traced outputs agree, as the fake rule does.
        _merged(kind, graphs, [tuple(output_values(g)) for g in graphs], shape_env=None)
    if not output_values(graphs[0]):
        # Branches that may not mutate their inputs and return nothing have no effect.
        # They were checked and traced, but there is nothing to record.
        return ()
    for name, gm in zip(kind.graph_names(tracer.root, len(graphs)), graphs):
        tracer.root.register_module(name, gm)
    args = pack(selector, graphs, operands)
    proxy_args = pytree.tree_map(tracer.unwrap_proxy, args)
    out_proxy = tracer.create_proxy("call_function", kind.op, proxy_args, {})
    out = kind.call_below_autograd(selector, graphs, operands)
    out = _compat.track_tensor_tree(out, out_proxy, constant=None, tracer=tracer)
    return written_back(out, written, lambda w, new: _recorded_copy(mode, operands[w], new))


def _recorded_copy(mode, target: torch.Tensor, value: torch.Tensor) -> None:
    with mode:  # so the enclosing graph records the write after the conditional
        target.copy_(value)


def _functional_copy(ctx, target: torch.Tensor, value: torch.Tensor) -> None:
    """Give the functional tensor ``target`` the new value ``value``. If ``target`` is a
    graph input, this records a mutation of it, as auto_functionalize writes back."""
    ctx.replace(target, value)
    ctx.commit_update(target)
    ctx.sync(target)


def _functionalize_rule(kind: ConditionalKind, ctx, selector, branches, operands):
    """Run the branches functionalized and write back what they write to.

    Their writes become extra outputs. This rule writes them back to the functional
    tensors, so the program records the input mutations."""
    labels = kind.labels(len(branches))
    facts = kind.branch_facts(selector, len(branches))
    tracer = _compat.active_fx_tracer()
    mode = getattr(ctx, "mode", None)
    if pretraced(branches, tracer, functional=True) is not None:
        # The Autograd rule traced them functionalized in this session. Record them as is.
        written, branches = pending_writes(branches)
    elif mode is not None and tracer is not None:
        operands, written, branches = _trace_functionalized(
            tracer, mode, branches, operands, labels, facts
        )
    elif mode is not None and not host_readable(selector):
        written, branches = _writes_found_by_running(ctx, mode, branches, operands, labels, facts)
    else:
        written = ()
        branches = [
            _functionalized_by_ctx(ctx, _compat.run_with_interpreter(plain(b)), label)
            for b, label in zip(branches, labels)
        ]
    inner_operands = ctx.unwrap_tensors(operands)
    inner_selector = (
        ctx.unwrap_tensors(selector) if isinstance(selector, torch.Tensor) else selector
    )
    with ctx.redispatch_to_next():
        out = kind.op(*pack(inner_selector, branches, inner_operands))
    out = written_back(out, written, lambda w, new: _functional_copy(ctx, operands[w], new))
    return ctx.wrap_tensors(out)


def _trace_functionalized(tracer, mode, branches, operands, labels, facts):
    """Trace the branches functionalized in the current session.

    Returns the operands with the closures lifted, the written positions, and the graphs
    to hand on. A given graph runs node by node, so the trace keeps its stack traces."""
    fns = [_compat.run_with_interpreter(plain(b)) for b in branches]
    traced = trace_in_session(tracer, fns, tuple(operands), labels, mode, facts=facts)
    written, branches = pending_writes(traced.branches)
    return traced.operands, written, branches


def _writes_found_by_running(ctx, mode, branches, operands, labels, facts):
    """Find the writes by running the branches functionalized, without a trace.

    AOTAutograd's metadata pass then sees the same input mutations as a trace. Returns
    the written positions and branches that also return the new values."""
    inner = ctx.unwrap_tensors(operands)
    fns = [_compat.run_with_interpreter(plain(b)) for b in branches]
    written = writes_of(fns, mode, labels, inner, facts)
    return written, [returning_writes(b, mode, label, written) for b, label in zip(fns, labels)]


def _functionalized_by_ctx(ctx, fn, label: str):
    """Return ``fn`` functionalized by ``ctx``, with writes to inputs kept in its trace.
    The Python mode needs ``functionalized_writing_back`` for that. C++ does it itself."""
    mode = getattr(ctx, "mode", None)
    return ctx.functionalize(fn) if mode is None else functionalized_writing_back(fn, mode, label)


def _functorch(kind: ConditionalKind, interpreter, selector, branches, operands):
    """Run a torch.func transform's rule. A readable selector makes it a Python ``if``.

    The taken branch then runs on the transform's wrapped tensors. So grad, jvp and vmap
    apply to it as they would to the same code written with ``if``. Otherwise grad and
    jvp differentiate the conditional into conditionals (autograd.py), and vmap maps
    every branch (batching.py).
    """
    if host_readable(selector, TRANSFORM, kind.op):
        out = kind.taken_branch(selector, branches)(*operands)
        return with_tangents(out) if interpreter.key() == _compat.JVP_TRANSFORM else out
    # Strict export's dynamo pass gets here. Non-strict export refuses earlier, in _proxy.
    refuse_wrapped_in_export(kind.name, labelled_inputs(selector, operands, len(operands)))
    if interpreter.key() in _compat.DIFFERENTIATING_TRANSFORMS:
        if isinstance(selector, torch.Tensor) and _compat.is_vmapped(selector):
            # The selector has one value per example of an outer vmap (per-example
            # gradients). Every branch runs here and a select picks. The transform then
            # differentiates plain ops, including tensors the branches close over.
            return run_all_and_select(
                kind, selector, branches, operands, kind.labels(len(branches))
            )
        return functorch_rule(kind, selector, branches, operands)
    return vmap_rule(kind, interpreter, selector, branches, operands)


def call(kind: ConditionalKind, selector, branches, operands):
    """Call ``kind.op(selector, *branches, operands)``.

    Under an eager torch.func transform, this goes straight to the transform's rule
    (``_functorch``). The operator's dispatch would get there only after flattening its
    arguments several times."""
    vmap = _compat.eager_vmap_level(selector)
    if vmap is not None:  # one selector per example, so every branch runs and a select picks
        # torch's dispatch to a transform does this first (dispatch_functorch).
        operands = tuple([_compat.unwrap_dead_tensor(t) for t in operands])
        return per_example(kind, *vmap, selector, branches, operands)
    interpreter = _compat.eager_functorch_interpreter()
    if interpreter is None:
        return kind.op(*pack(selector, branches, operands))
    selector = _compat.unwrap_if_dead(selector)
    operands = tuple([_compat.unwrap_dead_tensor(t) for t in operands])
    return _functorch(kind, interpreter, selector, branches, operands)


def _dead_wrappers(kind: ConditionalKind, selector, branches, operands):
    """Treat tensors of an ended torch.func level as the tensors they wrap."""
    inner = tuple(map(_compat.unwrap_if_dead, operands))
    inner_selector = _compat.unwrap_if_dead(selector)
    if inner_selector is selector and all(a is b for a, b in zip(inner, operands)):
        # The level is alive but set aside, so the same call would come back here.
        raise UnsupportedCondError(
            f"{kind.name} received a tensor of a torch.func level that is set aside "
            "here. This happens to a tensor a branch closes over when torch.func.grad "
            "(or another transform) runs around torch.func.functionalize in a trace: "
            "pass the tensors the branches close over as operands"
        )
    return kind.op(*pack(inner_selector, branches, inner))


# --- helpers -------------------------------------------------------------------------


def _all_branches_merged(kind, branches, operands, shape_env):
    with state.every_branch_runs():
        outs = [tuple(b(*operands)) for b in branches]
    return _merged(kind, branches, outs, shape_env)


def _merged(kind, branches, outs, shape_env, outside: frozenset = frozenset()):
    return merge_branch_outputs(outs, kind.labels(len(branches)), shape_env, outside)


def _check_named_outputs(branch_outputs, labels, out_spec) -> None:
    """Run ``merge.check_agreement``, with errors that name the output path in ``out_spec``."""
    try:
        check_agreement(branch_outputs, labels)
    except CondError as error:
        raise_named(error, out_spec, None)


def _install(kind: ConditionalKind) -> None:
    op = kind.op

    @op.py_impl(DispatchKey.CompositeExplicitAutograd)
    def dense(*args):
        return _dense(kind, *unpack(args))

    @op.py_impl(DispatchKey.Autograd)
    def autograd(*args):
        # This is not py_autograd_impl. That skips the rule when no operand requires
        # grad, before closures (parameters a branch reads) become operands.
        if takes_first(op):  # a mode that traces nothing decides first (modes.py)
            return modes_autograd_rule(kind, *unpack(args))
        selector, branches, operands = unpack(args)
        _refuse_subclass_training(kind, selector, operands)
        return autograd_rule(kind, selector, branches, operands)

    @op.py_impl(_compat.DEAD_WRAPPER_KEY)
    def dead_wrappers(*args):
        return _dead_wrappers(kind, *unpack(args))

    @op.py_impl(FlopCounterDispatchMode)
    def count_flops(mode, *args):
        return flop_rule(kind, mode, *unpack(args))

    @op.py_impl(FakeTensorMode)
    def fake(mode, *args):
        return _fake(kind, mode, *unpack(args))

    @op.py_impl(ProxyTorchDispatchMode)
    def proxy(mode, *args):
        return _proxy(kind, mode, *unpack(args))

    @op.py_functionalize_impl
    def functionalize(ctx, *args):
        return _functionalize_rule(kind, ctx, *unpack(args))

    for transform in _compat.FUNCTORCH_TRANSFORMS:

        @op.py_impl(transform)
        def functorch(interpreter, *args):
            return _functorch(kind, interpreter, *unpack(args))


for _kind in _KINDS.values():
    _install(_kind)

_compat_dynamo.install(
    {
        kind.op: (
            kind.constant_taken_index,
            kind.labels,
            kind.warn_if_exporting,
            kind.known_index,
            kind.branch_facts,
        )
        for kind in _KINDS.values()
    },
    _check_named_outputs,
    refuse_writes_under_transform,
    _compat_dynamo.StateRules(
        state.refuse_autograd_state,
        state.refuse_python_state,
        state.refuse_attribute,
        state.check_registry_change,
        state.ABSENT,
    ),
    _compat_dynamo.NumberRules(
        numbers.value_positions, numbers.check_kinds_in_specs, numbers.dynamo_info
    ),
)
_compat_export.install(frozenset(kind.op.name() for kind in _KINDS.values()))
_compat_inductor.install(cond_op, switch_op, in_place)
_compat_onnx.install(onnx_translations(cond_op, switch_op))
distributed.install(tuple(_KINDS.values()))
