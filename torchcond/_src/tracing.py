"""Flat functions as closure-free GraphModules: the one place a branch is traced.

``trace_branches`` traces branches as subgraphs of the current make_fx session,
lifting what they close over into explicit operands, and returns everything it
found as a value (``Traced``). ``materialize_graph`` traces the derivative graphs.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple, NoReturn

import torch

from .. import _compat
from .._compat import pytree
from ..errors import BranchMutationError
from . import subgraph
from .state import every_branch_runs


class PretracedBranch:
    """A branch already traced, closure-free, as a subgraph of one make_fx session.

    It exists so that each branch is traced once per session: the Autograd and
    Functionalize rules trace the branches, and the rules below them record these
    graphs (``pretraced``) instead of tracing the branches again. Anywhere else it is
    the function its graph computes.

    ``functional``: traced under functionalization. ``written``: the positions of the
    operands the branch writes to. The graph writes to none of them: it returns their
    new values after its own outputs, and the rule that records the conditional
    writes them back (``pending_writes``).
    """

    __slots__ = ("__name__", "functional", "graph", "tracer", "written")

    def __init__(self, graph: torch.fx.GraphModule, tracer, functional: bool, written: tuple = ()):
        self.graph = graph
        self.tracer = tracer
        self.functional = functional
        self.written = written
        self.__name__ = "pretraced_branch"

    def __call__(self, *args):
        return self.graph(*args)


def pretraced(branches, tracer, functional: bool | None = None):
    """``(graphs, written)`` when every branch is a ``PretracedBranch`` of ``tracer``
    (traced with functionalization ``functional``, if given); else None."""
    if not all(isinstance(b, PretracedBranch) and b.tracer is tracer for b in branches):
        return None
    if functional is not None and any(b.functional is not functional for b in branches):
        return None
    return [b.graph for b in branches], branches[0].written


def pending_writes(branches) -> tuple[tuple[int, ...], list]:
    """The operand positions whose new values ``branches`` return last, and the
    branches handed on once the caller takes on writing them back: the same graphs,
    whose extra outputs are then plain outputs to the rules below."""
    written = getattr(branches[0], "written", ())
    if not written:
        return (), list(branches)
    return written, [PretracedBranch(b.graph, b.tracer, b.functional) for b in branches]


def _refuse_writes_under_derivative(written: Sequence[int], n_operands: int, labels) -> None:
    """Refuse writes found while the Autograd rule's own conditional runs its forward:
    the derivative recomputes the branches from operands the write-back would change.

    The Autograd rule traces writing branches itself, before its ``autograd.Function``,
    and writes back above it.
    """
    if _IN_CONDITIONAL_FORWARD.get():
        refuse_writes_under_transform(written, n_operands, labels)


def refuse_writes_under_transform(written: Sequence[int], n_operands: int, labels) -> None:
    """Refuse writes to the inputs of a conditional a torch.func transform
    differentiates: its derivative recomputes the branches from the operands, which
    the write would change."""
    if not written:
        return
    message = (
        f"{' / '.join(labels)} writes in place to {{path}} inside a conditional that a "
        "torch.func transform (grad, jvp, vjp, ...) differentiates with a selector the "
        "host cannot read: its derivative recomputes the branch from the operands, which "
        "the write changes. Differentiate with torch.autograd instead (make_fx, "
        "torch.compile and torch.export support such writes), or return the new value"
    )
    raise_about_write(message, written[0], n_operands, "a tensor it closes over")


def raise_about_write(message: str, w: int, n_operands: int, closure: str) -> NoReturn:
    """Raise ``BranchMutationError(message)`` about input ``w``: an operand is named by
    its path (``{path}``), a lifted closure as ``closure``."""
    if w < n_operands:
        raise BranchMutationError.at("operand", w, message)
    raise BranchMutationError(message.format(path=closure))


def written_back(out, written: Sequence[int], write) -> tuple:
    """The conditional's own outputs; the new values of the operands at ``written``,
    returned after them, are written back with ``write(position, value)``."""
    if not written:
        return out
    n = len(out) - len(written)
    for w, new in zip(written, out[n:]):
        write(w, new)
    return tuple(out[:n])


def plain(branch):
    """A branch as the function it is: a ``PretracedBranch``'s graph, anything else as is."""
    return branch.graph if isinstance(branch, PretracedBranch) else branch


# A graph's queries of its tensors' sizes, as make_fx records them where sizes are
# symbolic, answered by the tensors' Python methods.
_SIZE_QUERIES: dict[object, Callable] = {
    torch.ops.aten.sym_size.int: torch.Tensor.size,
    torch.ops.aten.sym_stride.int: torch.Tensor.stride,
    torch.ops.aten.sym_numel.default: torch.Tensor.numel,
    torch.ops.aten.sym_storage_offset.default: torch.Tensor.storage_offset,
}


def logical_sizes(branch):
    """``branch`` to run on a vmap level's batched tensors: a graph that queries sizes
    is run node by node, each query answered with the per-example size, as the
    code it was traced from reads it (the operators have no batching rule)."""
    gm = plain(branch)
    if not isinstance(gm, torch.fx.GraphModule) or not any(
        node.op == "call_function" and node.target in _SIZE_QUERIES for node in gm.graph.nodes
    ):
        return branch
    return _LogicalSizes(gm).run_branch


class _LogicalSizes(torch.fx.Interpreter):
    def run_branch(self, *args):
        from torch.fx import traceback as fx_traceback

        # Each node's meta (its stack trace) current while it runs, as for a trace.
        with fx_traceback.preserve_node_meta():
            return self.run(*args)

    def call_function(self, target, args, kwargs):
        query = _SIZE_QUERIES.get(target)
        if query is not None:
            return query(*args, **kwargs)
        return super().call_function(target, args, kwargs)


class Traced(NamedTuple):
    """Branches traced into closure-free graphs of one make_fx session."""

    # The operands given, then every closed-over tensor or SymInt a branch used,
    # deduplicated, in order of first use (branch by branch).
    operands: tuple
    # The branches to hand to the operator in this session: one GraphModule per
    # branch, every one taking ``operands``, as PretracedBranches.
    branches: list[PretracedBranch]

    @property
    def graphs(self) -> list[torch.fx.GraphModule]:
        return [b.graph for b in self.branches]

    @property
    def written(self) -> tuple[int, ...]:
        """The positions in ``operands`` of the tensors some branch writes to; every
        graph returns their new values after its own outputs, in this order."""
        return self.branches[0].written


def functionalized_writing_back(fn: Callable, mode, label: str) -> Callable:
    """``fn`` under the Python functionalization ``mode``, on functional wrappers of its
    (plain) inputs, returning plain tensors.

    Functionalization turns a write to an input into a new value of the input's
    wrapper, which the trace would otherwise drop. As C++ functionalization does, the
    new value is written back at the end (``input.copy_(value)``), so the write shows
    in the branch's graph, where ``trace_branches`` makes it an output. A change of an
    input's sizes or strides in place cannot be written back and is refused here.
    """

    def run(*args):
        out, written = run_functionalized(fn, mode, label, args)
        for i, value in written:
            args[i].copy_(value)
        return out

    return run


def run_functionalized(fn: Callable, mode, label: str, args: tuple):
    """``fn(*args)`` functionalized by ``mode``: its outputs, and ``(position, new
    value)`` for each input it wrote to, as plain tensors; the inputs are left as they
    were."""
    # A real tensor among fake ones is a constant the branch made (``torch.tensor([1])``,
    # lifted): it stays as it is, as fake tensors take constants.
    fake = _compat.fake_mode_of(args) is not None
    with _compat.functionalize_key_excluded(), mode:
        wrapped = [
            _compat.to_functional(a)
            if isinstance(a, torch.Tensor) and not (fake and _compat.is_real_tensor(a))
            else a
            for a in args
        ]
        out = fn(*wrapped)
        out = pytree.tree_map(_compat.from_functional, out)
        written = []
        for i, wrapper in enumerate(wrapped):
            if not isinstance(wrapper, torch.Tensor):
                continue
            data, metadata = _compat.mutated_in_place(wrapper)
            if metadata:
                raise BranchMutationError.at(
                    "operand",
                    i,
                    f"{label} changes the sizes or strides of its input {{path}} in place "
                    "(resize_, t_, as_strided_, ...), which a traced conditional cannot "
                    "do: return the reshaped value instead",
                )
            if data:
                written.append((i, _compat.from_functional(wrapper)))
    return out, written


def writes_of(fns: Sequence[Callable], mode, labels: Sequence[str], args: tuple) -> tuple:
    """The positions of the inputs some of ``fns`` writes to, found by running each
    functionalized by ``mode`` (on fake tensors: nothing is written)."""
    written: set[int] = set()
    for fn, label in zip(fns, labels):
        written.update(i for i, _ in run_functionalized(fn, mode, label, args)[1])
    return tuple(sorted(written))


def returning_writes(fn: Callable, mode, label: str, written: Sequence[int]) -> Callable:
    """``fn`` functionalized by ``mode``, returning the new values of its inputs at
    ``written`` (the old value where it leaves one alone) after its own outputs."""

    def run(*args):
        out, new = run_functionalized(fn, mode, label, args)
        new_values = dict(new)
        return (*out, *(new_values.get(i, args[i]) for i in written))

    return run


def _lift_key(value) -> int:
    return id(value.node) if isinstance(value, torch.SymInt) else id(value)


def lifts_nothing_else(value) -> bool:
    return False


def trace_branches(
    parent_tracer,
    branches: Sequence[Callable],
    operands: tuple,
    labels: Sequence[str],
    functional: bool = False,
    lift_also: Callable[[object], bool] = lifts_nothing_else,
) -> Traced:
    """Trace every branch into a GraphModule taking the same flat inputs.

    The graphs are checked and rewritten by ``pretraced_branches``. ``functional``: the
    branches are traced under functionalization (recorded on the PretracedBranches).
    ``lift_also(value)``: a tensor the enclosing trace does not know that is a
    closure all the same (a stand-in for a batched tensor, closures.py).
    """
    with every_branch_runs(), _real_constants_kept(_compat.fake_mode_of(operands) is not None):
        traced = [trace_lifting(b, operands, parent_tracer, lift_also=lift_also) for b in branches]
        lifted: dict[int, object] = {}
        for _, branch_lifted in traced:
            for value, _node in branch_lifted:
                lifted.setdefault(_lift_key(value), value)

        graphs = [gm for gm, _ in traced]
        for gm, branch_lifted in traced:
            _align_lifted_placeholders(gm, branch_lifted, lifted, len(operands))
        every_operand = tuple(operands) + tuple(lifted.values())
        graphs, written = _writes_as_outputs(
            graphs, every_operand, len(operands), labels, parent_tracer, functional
        )
    _refuse_writes_under_derivative(written, len(operands), labels)
    return Traced(
        every_operand,
        pretraced_branches(graphs, labels, len(operands), parent_tracer, functional, written),
    )


# While branches are traced on fake tensors: the real tensors they close over (with
# one element: fake tensors refuse larger ones), each with its value before.
_REAL_CONSTANTS: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "torchcond_real_constants", default=None
)


@contextlib.contextmanager
def _real_constants_kept(fake: bool):
    """A trace on fake tensors writes nothing real: make_fx computes an op on real
    one-element tensors for real, so a branch's write to one it closes over would
    land while every branch is traced. Their values are put back afterwards."""
    if not fake:
        yield
        return
    kept: list = []
    token = _REAL_CONSTANTS.set(kept)
    try:
        yield
    finally:
        _REAL_CONSTANTS.reset(token)
        with _compat.disable_proxy_modes_tracing(), _compat.every_mode_set_aside():
            for tensor, value in reversed(kept):
                tensor.copy_(value)


def _writes_as_outputs(
    graphs, operands: tuple, n_operands: int, labels, parent_tracer, functional: bool
):
    """Graphs that write to none of their inputs, returning the new values of those
    some branch writes to (cond_v2's "mutated variables become outputs").

    A graph that writes to an input is traced again functionalized, unless it was
    traced so: its only writes are then the trailing ``copy_``s functionalization
    adds, which ``subgraph.writes_as_outputs`` turns into outputs.
    """
    writes = [subgraph.written_inputs(gm) for gm in graphs]
    if not any(writes):
        return graphs, ()
    if not functional:
        graphs = [
            _functional_retrace(gm, operands, parent_tracer, label) if mine else gm
            for gm, mine, label in zip(graphs, writes, labels)
        ]
        # Functionalization may find more: an op whose schema does not show its write
        # (a pre-dispatch trace's batch_norm updates its running statistics).
        writes = [subgraph.written_inputs(gm) for gm in graphs]
    written = tuple(sorted(set().union(*writes)))
    _check_writable(operands, n_operands, written, labels, writes)
    for gm in graphs:
        subgraph.writes_as_outputs(gm, written)
    return graphs, written


def _functional_retrace(gm, operands: tuple, parent_tracer, label: str) -> torch.fx.GraphModule:
    fn = functionalized_writing_back(_replaying(gm), _compat.new_functional_mode(), label)
    retraced, _ = trace_lifting(fn, operands, parent_tracer, user_stack_traces=False)
    return retraced


def _replaying(gm: torch.fx.GraphModule) -> Callable:
    """``gm`` run node by node, each node's meta (its stack trace) current while it runs,
    so that a trace of it records the same."""
    from torch.fx import traceback as fx_traceback

    def run(*args):
        with fx_traceback.preserve_node_meta():
            return torch.fx.Interpreter(gm).run(*args)

    return run


def _check_writable(operands: tuple, n_operands: int, written, labels, writes) -> None:
    """Refuse writes that cannot be written back as a Python ``if`` would make them."""
    for w in written:
        label = next(lab for lab, mine in zip(labels, writes) if w in mine)
        target = operands[w]
        aliased = any(
            j != w
            and isinstance(other, torch.Tensor)
            and _compat.storage_key(other) == _compat.storage_key(target)
            for j, other in enumerate(operands)
        )
        if aliased:
            why = (
                "which shares memory with another tensor the conditional receives. Each "
                "is traced as an input of its own, so the write could not reach the other "
                "as it does in eager: pass the tensor once"
            )
        elif _compat.is_functorch_wrapped(target):
            why = (
                "a tensor under torch.vmap, which torch.export cannot write back; return "
                "the new value instead (x + 1 rather than x.add_(1))"
            )
        elif _compat.is_real_tensor(target) and _compat.fake_mode_of(operands) is not None:
            why = (
                "a real tensor in a trace on fake tensors: the traced program holds it as "
                "a constant, which a branch's write cannot reach as a written-back value. "
                "Pass it as an operand, or register it as a buffer of the module "
                "(torch.export traces buffers as inputs and writes them back)"
            )
        else:
            continue
        closure = f"a tensor it closes over (shape {tuple(target.shape)})"
        raise_about_write(f"{label} writes in place to {{path}}, {why}", w, n_operands, closure)


def pretraced_branches(
    graphs: Sequence[torch.fx.GraphModule],
    labels: Sequence[str],
    n_operands: int,
    tracer,
    functional: bool,
    written: tuple = (),
) -> list[PretracedBranch]:
    """Graphs just traced in ``tracer``'s session, checked and made fit to record as
    one conditional: none writes to its inputs, none returns an alias of an input,
    and where they disagree on an output's strides, each returns it contiguous.

    ``functional``: traced under functionalization. A graph that writes nothing in
    place is what functionalization would make of it, and counts as functional too.
    """
    for gm, label in zip(graphs, labels):
        subgraph.reject_input_writes(gm, label, n_operands)
        subgraph.copy_aliased_outputs(gm)
    subgraph.align_output_layouts(graphs)
    return [
        PretracedBranch(gm, tracer, functional or not subgraph.writes_in_place(gm), written)
        for gm in graphs
    ]


_COUNTER = re.compile(r"_\d+$")


def renamed_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose op nodes are named as a fresh trace of it names them.

    Derivative graphs lose nodes (the forward outputs nothing reads) after they are
    traced; recorded as they are, their names would keep the gaps (``mul_1`` with no
    ``mul``). The copy also lets one cached graph be recorded at several nodes, each
    with a module of its own.
    """
    graph = torch.fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        args, kwargs = torch.fx.map_arg((node.args, node.kwargs), env.__getitem__)
        if node.op == "output":
            graph.output(args[0]).meta = dict(node.meta)
            continue
        renamed = node.op in ("call_function", "call_method", "call_module")
        copy = graph.create_node(
            node.op,
            node.target,
            args,
            kwargs,
            name=_COUNTER.sub("", node.name) if renamed else node.name,
            type_expr=node.type,
        )
        copy.meta = dict(node.meta)
        env[node] = copy
    return torch.fx.GraphModule(gm, graph, gm.__class__.__name__)


def _align_lifted_placeholders(gm, branch_lifted, lifted: dict, n_operands: int) -> None:
    """Give ``gm`` one placeholder per lifted value, in the shared order."""
    graph = gm.graph
    mine = {_lift_key(v): node for v, node in branch_lifted}
    anchor = graph.find_nodes(op="placeholder")[n_operands - 1] if n_operands else None
    for key, value in lifted.items():
        node = mine.get(key)
        if node is None:
            where = (
                graph.inserting_after(anchor)
                if anchor
                else graph.inserting_before(next(iter(graph.nodes)))
            )
            with where:
                node = graph.placeholder("unused_lifted")
            node.target = node.name
            node.meta["val"] = value
        elif anchor is not None:
            anchor.append(node)
        else:
            next(iter(graph.nodes)).prepend(node)
        anchor = node
    graph.lint()
    gm.recompile()


# --- a function traced as a subgraph of the current trace, closures lifted ---------


class _LiftingTracker:
    """A proxy-slot table that, on a miss, lifts what the parent tracer knows.

    make_fx's sub-tracer bakes a tensor it has never seen into the subgraph as a
    constant, and fails on a SymInt it has never seen. Both are closures over values
    of the enclosing graph. Here a miss asks the parent tracer; when the parent tracks
    the value, it becomes a new placeholder of the subgraph and is recorded so the
    caller can pass it in as an explicit operand.
    """

    def __init__(self, base, sub_tracer, parent_tracer, lifted: list, constants: bool, also):
        self._base = base
        self._sub = sub_tracer
        self._parent = parent_tracer
        self._lifted = lifted
        self._constants = constants
        self._also = also

    def get(self, key, default=None):
        value = self._base.get(key)
        if value is None:
            value = self._lift(key)
        return default if value is None else value

    def __getattr__(self, name):
        return getattr(self._base, name)

    def __contains__(self, key):
        return key in self._base

    def __getitem__(self, key):
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value):
        self._base[key] = value

    def __len__(self):
        return len(self._base)

    def _lift(self, key):
        outer = _compat.get_proxy_slot(key, self._parent, None)
        if outer is not None:
            outer_proxy = outer.proxy if isinstance(key, torch.Tensor) else outer.force()
            name = outer_proxy.node.name
        elif self._also(key):
            name = "closure"
        elif self._constants and _compat.is_real_tensor(key):
            # A plain tensor attribute or global: a constant of the whole program. It
            # is lifted too, so the enclosing graph owns it (export lifts constants).
            name = "closed_over_constant"
            kept = _REAL_CONSTANTS.get()
            if kept is not None:
                with _compat.disable_proxy_modes_tracing(), _compat.every_mode_set_aside():
                    kept.append((key, key.clone()))
        else:
            return None
        graph = self._sub.graph
        placeholders = graph.find_nodes(op="placeholder")
        where = (
            graph.inserting_after(placeholders[-1])
            if placeholders
            else graph.inserting_before(next(iter(graph.nodes), None))
        )
        with where:
            node = graph.placeholder(name)
        node.target = node.name  # the argument name must be unique too
        proxy = torch.fx.Proxy(node, self._sub)
        if isinstance(key, torch.Tensor):
            _compat.track_tensor_tree(key, proxy, constant=None, tracer=self._sub)
        else:
            node.meta["val"] = key
            self._base[key] = _compat.thunkify(self._sub, lambda: proxy)
        self._lifted.append((key, node))
        return self._base.get(key)


def trace_lifting(
    fn: Callable,
    args: tuple,
    parent_fx_tracer,
    user_stack_traces: bool = True,
    lift_constants: bool = True,
    lift_also: Callable[[object], bool] = lifts_nothing_else,
) -> tuple[torch.fx.GraphModule, list]:
    """make_fx ``fn`` as a subgraph of the current trace, lifting closures.

    Returns the GraphModule and ``[(value, placeholder_node), ...]`` for every value
    lifted, in first-use order. With ``user_stack_traces`` nodes carry the user's
    stack trace; without, they keep what the graph being re-run recorded. Without
    ``lift_constants`` a real tensor the enclosing trace does not know stays a
    constant of the subgraph. ``lift_also``: as for ``trace_branches``.
    """
    parent = _compat.current_make_fx_tracer()
    if parent.fx_tracer is not parent_fx_tracer:
        # make_fx keeps its current tracer in a process-wide variable (2.11-2.15): with
        # two threads tracing, it can be the other thread's, whose fake mode entered
        # here aborts the process. The caller's tracer comes from this thread's modes.
        raise RuntimeError(
            "torchcond: cannot trace a branch: torch's current make_fx session belongs to "
            "another thread (make_fx is not thread-safe; trace in one thread at a time)"
        )
    sub = _compat.new_sub_tracer(parent)
    lifted: list = []
    with _compat.sub_tracer_modes(sub, parent):
        fx_tracer = sub.fx_tracer
        _compat.wrap_proxy_slots(
            fx_tracer,
            lambda table: _LiftingTracker(
                table, fx_tracer, parent_fx_tracer, lifted, lift_constants, lift_also
            ),
        )
        traces = _branch_stack_traces(fx_tracer) if user_stack_traces else contextlib.nullcontext()
        with traces, _marking_grad_disabled_nodes(fx_tracer):
            gm = _compat.trace_inner(sub, fn, args)
    return gm, lifted


# Node meta key: the traced code itself turned grad off for this node (a
# ``torch.no_grad()`` block). Re-running the graph to differentiate it runs such nodes
# under no_grad, so they stay constants, as they are to the branch's own autograd.
GRAD_DISABLED = "torchcond_grad_disabled"
# Node meta key: grad was off for this node, and the traced code did not turn it off.
# The node is part of an autograd.Function's forward (or an inference_mode block). Its
# derivative is that Function's backward, which the graph does not hold.
OWN_BACKWARD = "torchcond_own_backward"


def runs_custom_forward(gm: torch.fx.GraphModule) -> bool:
    """Some node of ``gm`` or of a graph nested in it is marked ``OWN_BACKWARD``."""
    return any(
        node.meta.get(OWN_BACKWARD)
        for module in gm.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
    )


class _GradModeSetByCode(torch.overrides.TorchFunctionMode):
    """Grad mode as the traced code sets it, and the ops the code calls with grad off.

    ``no_grad``, ``enable_grad`` and ``set_grad_enabled`` go through
    ``torch._C._set_grad_enabled``, a torch function. An autograd.Function also runs
    its forward with grad off, but in C++: that forward is differentiable code, and
    only the code's own switches count. The ops the code calls while grad is off
    (inside such a forward) are kept, for ``_marks_own_backward``.
    """

    def __init__(self):
        super().__init__()
        self.enabled = True
        self.calling_without_grad: list = []  # innermost last

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is _compat.set_grad_enabled:
            self.enabled = bool(args[0])
        elif isinstance(func, _compat.OpOverload) and not torch.is_grad_enabled():
            self.calling_without_grad.append(func)
            try:
                return func(*args, **(kwargs or {}))
            finally:
                self.calling_without_grad.pop()
        return func(*args, **(kwargs or {}))


# Set while torchcond's own autograd.Function runs its forward: the conditional node
# it records is differentiated by the operator's Autograd rule, not a user's backward.
_IN_CONDITIONAL_FORWARD: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "torchcond_in_conditional_forward", default=False
)


@contextlib.contextmanager
def conditional_forward():
    """Around ``autograd.DifferentiableConditional.forward``: its grad-off is not a custom backward's."""
    token = _IN_CONDITIONAL_FORWARD.set(True)
    try:
        yield
    finally:
        _IN_CONDITIONAL_FORWARD.reset(token)


def _marks_own_backward(node: torch.fx.Node, grad_mode: _GradModeSetByCode) -> bool:
    """Whether ``node``, made with grad off though the code did not turn it off, is
    part of a forward whose derivative the graph does not hold.

    Not so for an op with its own derivative (a ``torch.library`` custom op with
    ``register_autograd``), which runs below autograd with grad off: its node is the
    op, and running it with grad on runs its derivative. Unless the code itself
    called it with grad off, inside an autograd.Function's forward.
    """
    if _IN_CONDITIONAL_FORWARD.get():
        return False
    calling = grad_mode.calling_without_grad
    called_without_grad = bool(calling) and calling[-1] is node.target
    return called_without_grad or not _compat.has_own_derivative(node.target)


@contextlib.contextmanager
def _marking_grad_disabled_nodes(fx_tracer):
    """Mark the nodes created while the traced code has grad off.

    A trace that begins with grad off (inside an autograd.Function's forward, under
    the caller's ``no_grad``) is not differentiated through; it marks nothing.
    """
    if not torch.is_grad_enabled():
        yield
        return
    grad_mode = _GradModeSetByCode()
    create_node = fx_tracer.create_node

    def create_node_marking_grad_mode(*args, **kwargs):
        node = create_node(*args, **kwargs)
        if not grad_mode.enabled:
            node.meta[GRAD_DISABLED] = True
        elif not torch.is_grad_enabled() and _marks_own_backward(node, grad_mode):
            node.meta[OWN_BACKWARD] = True
        return node

    fx_tracer.create_node = create_node_marking_grad_mode
    with grad_mode:
        yield


@contextlib.contextmanager
def _branch_stack_traces(fx_tracer):
    """Nodes record the branch's own source lines, not the line that called cond.

    Export keeps the caller's stack trace in fx's "current meta" and stamps it on
    every node it creates; while a branch is traced we hide it and let the tracer
    record the user's frames (the innermost is the branch's line).
    """
    from torch.fx import traceback as fx_traceback

    _compat.keep_stack_frames(fx_tracer)
    saved = fx_traceback.current_meta.pop("stack_trace", None)
    try:
        yield
    finally:
        # Put back into the current meta, not the dict popped from: make_fx's
        # preserve_node_meta restores a copy of the meta it found on entry.
        if saved is not None:
            fx_traceback.current_meta["stack_trace"] = saved


def _fresh_leaf(value):
    """A new leaf tensor with ``value``'s metadata, tracked by no tracer or autograd graph."""
    if not isinstance(value, torch.Tensor):
        return value
    return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=value.device)


def materialize_graph(fn: Callable, args: tuple) -> torch.fx.GraphModule:
    """Trace ``fn(*args)`` into a closure-free GraphModule, with autograd on.

    Inputs are fresh leaf tensors shaped like ``args`` (so ``fn`` may make them
    require grad and differentiate with respect to them). Inside a make_fx session
    this is a subgraph of the current trace: same fake mode, same shape env, same
    decompositions. Functionalization and the caller's modes are set aside while
    tracing, as a HOP's branch tracing does.
    """
    in_session = _compat.in_make_fx_session()
    parent_fx_tracer = _compat.active_fx_tracer()
    fake_mode = _compat.fake_mode_of(args)
    with contextlib.ExitStack() as stack:
        # Outer torch.func levels stay outside: the graph is a plain function.
        stack.enter_context(_compat.every_mode_set_aside())
        if fake_mode is not None:
            stack.enter_context(fake_mode)
        with _compat.disable_proxy_modes_tracing():
            leaves = tuple(_fresh_leaf(a) for a in args)
        stack.enter_context(torch.enable_grad())
        if in_session and parent_fx_tracer is not None:
            # A constant the branch makes (``torch.tensor(2.0)``) stays in the graph:
            # it is made anew each time, so it is no closure.
            gm, lifted = trace_lifting(
                fn, leaves, parent_fx_tracer, user_stack_traces=False, lift_constants=False
            )
            if lifted:
                raise AssertionError(f"derivative graph closed over {len(lifted)} values: {lifted}")
            return gm
        return _compat.make_fx_keeping_detach(fn, leaves)
