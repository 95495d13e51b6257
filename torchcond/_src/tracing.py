"""Tracing of flat functions into closure-free GraphModules.

This is the only module that traces a branch. ``trace_branches`` traces branches as
subgraphs of the current make_fx session. It lifts what they close over into
explicit operands and returns everything it found as one value (``Traced``).
``materialize_graph`` traces the derivative graphs.
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

    It lets each branch be traced once per session. The Autograd and Functionalize
    rules trace the branches. The rules below them record these graphs (``pretraced``)
    instead of tracing again. Anywhere else it acts as the function its graph computes.

    ``functional`` says the branch was traced under functionalization. ``written``
    holds the positions of the operands the branch writes to. The graph returns their
    new values after its own outputs and writes to none of them. The rule that records
    the conditional writes them back (``pending_writes``).
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
    """Return ``(graphs, written)`` if every branch is a ``PretracedBranch`` of ``tracer``.

    If ``functional`` is given, every branch must match it too. Otherwise return None."""
    if not all(isinstance(b, PretracedBranch) and b.tracer is tracer for b in branches):
        return None
    if functional is not None and any(b.functional is not functional for b in branches):
        return None
    return [b.graph for b in branches], branches[0].written


def pending_writes(branches) -> tuple[tuple[int, ...], list]:
    """Return the written operand positions and the branches to hand on.

    The caller writes back the new values that ``branches`` return last. The rules
    below then see those values as plain outputs of the same graphs."""
    written = getattr(branches[0], "written", ())
    if not written:
        return (), list(branches)
    return written, [PretracedBranch(b.graph, b.tracer, b.functional) for b in branches]


def _refuse_writes_under_derivative(written: Sequence[int], n_operands: int, labels) -> None:
    """Refuse writes found while the Autograd rule's own conditional runs its forward.
    The derivative recomputes the branches from operands the write-back would change."""
    if _IN_CONDITIONAL_FORWARD.get():
        refuse_writes_under_transform(written, n_operands, labels)


def refuse_writes_under_transform(written: Sequence[int], n_operands: int, labels) -> None:
    """Refuse writes to the inputs of a conditional that a torch.func transform
    differentiates. Its derivative recomputes the branches from the operands, and the
    write would change them."""
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
    """Raise ``BranchMutationError(message)`` about input ``w``. The message names an
    operand by its path (``{path}``) and a lifted closure as ``closure``."""
    if w < n_operands:
        raise BranchMutationError.at("operand", w, message)
    raise BranchMutationError(message.format(path=closure))


def written_back(out, written: Sequence[int], write) -> tuple:
    """Return the conditional's own outputs, and write back the values that follow them.

    Those values are the new values of the operands at ``written``. Each one goes to
    ``write(position, value)``."""
    if not written:
        return out
    n = len(out) - len(written)
    for w, new in zip(written, out[n:]):
        write(w, new)
    return tuple(out[:n])


def plain(branch):
    """Return a ``PretracedBranch``'s graph, or any other branch as it is."""
    return branch.graph if isinstance(branch, PretracedBranch) else branch


# make_fx records these size queries where sizes are symbolic. Each maps to the
# tensor method that answers it.
_SIZE_QUERIES: dict[object, Callable] = {
    torch.ops.aten.sym_size.int: torch.Tensor.size,
    torch.ops.aten.sym_stride.int: torch.Tensor.stride,
    torch.ops.aten.sym_numel.default: torch.Tensor.numel,
    torch.ops.aten.sym_storage_offset.default: torch.Tensor.storage_offset,
}


def logical_sizes(branch):
    """Make ``branch`` runnable on a vmap level's batched tensors.

    The operators have no batching rule. So a graph that queries sizes runs node by
    node, and each query gets the per-example size, as the traced code read it."""
    gm = plain(branch)
    if not isinstance(gm, torch.fx.GraphModule) or not any(
        node.op == "call_function" and node.target in _SIZE_QUERIES for node in gm.graph.nodes
    ):
        return branch
    return _LogicalSizes(gm).run_branch


class _LogicalSizes(torch.fx.Interpreter):
    def run_branch(self, *args):
        from torch.fx import traceback as fx_traceback

        # Keep each node's meta (its stack trace) current while it runs, as a trace does.
        with fx_traceback.preserve_node_meta():
            return self.run(*args)

    def call_function(self, target, args, kwargs):
        query = _SIZE_QUERIES.get(target)
        if query is not None:
            return query(*args, **kwargs)
        return super().call_function(target, args, kwargs)


class Traced(NamedTuple):
    """Branches traced into closure-free graphs of one make_fx session."""

    # The given operands, then each closed-over tensor or SymInt a branch used. The
    # closures appear once each, in order of first use, branch by branch.
    operands: tuple
    # The branches to hand to the operator in this session, as PretracedBranches.
    # Each wraps one GraphModule that takes ``operands``.
    branches: list[PretracedBranch]

    @property
    def graphs(self) -> list[torch.fx.GraphModule]:
        return [b.graph for b in self.branches]

    @property
    def written(self) -> tuple[int, ...]:
        """Positions of written operands. Graphs return their new values last, in this order."""
        return self.branches[0].written


def functionalized_writing_back(fn: Callable, mode, label: str) -> Callable:
    """Wrap ``fn`` to run under the Python functionalization ``mode``.

    A write to an input becomes a new value of its functional wrapper, which the trace
    would drop. So the wrapper copies each new value back at the end, as C++
    functionalization does. The write then shows in the branch's graph, where
    ``trace_branches`` makes it an output.
    """

    def run(*args):
        out, written = run_collecting_writes(fn, mode, label, args)
        for i, value in written:
            args[i].copy_(value)
        return out

    return run


def run_collecting_writes(fn: Callable, mode, label: str, args: tuple):
    """Run ``fn(*args)`` functionalized by ``mode``, leaving the inputs unchanged.

    Returns the outputs and ``(position, new value)`` for each input written, all as
    plain tensors.
    """
    # A real tensor among fake ones is a lifted constant the branch made, such as
    # ``torch.tensor([1])``. It stays unwrapped, because fake tensors accept constants.
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
            if _compat.storage_changed(wrapper):
                # A write back would change the old storage, which the input's other
                # views share, where x.data = y leaves it alone.
                raise BranchMutationError.at(
                    "operand",
                    i,
                    f"{label} gives its input {{path}} new storage in place (x.data = y, "
                    "set_), which a traced conditional cannot carry: write the new value "
                    "into it (x.copy_(y) under torch.no_grad()), or return it",
                )
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


def writes_of(
    fns: Sequence[Callable], mode, labels: Sequence[str], args: tuple, facts: Sequence
) -> tuple:
    """Return the positions of the inputs that some of ``fns`` write to.

    Each function runs functionalized by ``mode``, so nothing is written, and assuming
    its ``facts`` (``trace_branches``)."""
    written: set[int] = set()
    env = getattr(_compat.fake_mode_of(args), "shape_env", None)
    for fn, label, f in zip(fns, labels, facts):
        with _compat.assuming(env, f, label) as branch:
            given = branch.specialized(args)
            written.update(i for i, _ in run_collecting_writes(fn, mode, label, given)[1])
    return tuple(sorted(written))


def returning_writes(fn: Callable, mode, label: str, written: Sequence[int]) -> Callable:
    """Wrap ``fn`` to run functionalized by ``mode`` and return its inputs' new values.

    The values of the inputs at ``written`` follow ``fn``'s own outputs. An input
    that ``fn`` leaves alone keeps its old value."""

    def run(*args):
        out, new = run_collecting_writes(fn, mode, label, args)
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
    facts: Sequence[Sequence] | None = None,
) -> Traced:
    """Trace every branch into a GraphModule that takes the same flat inputs.

    ``pretraced_branches`` checks and rewrites the graphs. ``functional`` says the
    branches run under functionalization, and the PretracedBranches record it.
    ``lift_also(value)`` says whether a tensor unknown to the enclosing trace is still
    a closure. One example is a stand-in for a batched tensor (closures.py).
    ``facts[k]`` is what branch k may assume (``ConditionalKind.branch_facts``).
    """
    facts = facts or [()] * len(branches)
    with every_branch_runs(), _real_constants_kept(_compat.fake_mode_of(operands) is not None):
        traced = [
            trace_lifting(b, operands, parent_tracer, lift_also=lift_also, facts=f, label=label)
            for b, f, label in zip(branches, facts, labels)
        ]
        lifted: dict[int, object] = {}
        for _, branch_lifted in traced:
            for value, _node in branch_lifted:
                lifted.setdefault(_lift_key(value), value)

        graphs = [gm for gm, _ in traced]
        for gm, branch_lifted in traced:
            _align_lifted_placeholders(gm, branch_lifted, lifted, len(operands))
        every_operand = tuple(operands) + tuple(lifted.values())
        graphs, written = _writes_as_outputs(
            graphs, every_operand, len(operands), labels, parent_tracer, functional, facts
        )
    _refuse_writes_under_derivative(written, len(operands), labels)
    return Traced(
        every_operand,
        pretraced_branches(graphs, labels, len(operands), parent_tracer, functional, written),
    )


# Set while branches are traced on fake tensors. It holds the real tensors they close
# over, each with its value before the trace. Such tensors have one element, because
# fake tensors refuse larger ones.
_REAL_CONSTANTS: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "torchcond_real_constants", default=None
)


@contextlib.contextmanager
def _real_constants_kept(fake: bool):
    """Restore the real tensors that branches close over after a trace on fake tensors.

    make_fx computes ops on real one-element tensors for real. So a branch's write to
    one would land during the trace, but a fake trace must write nothing real."""
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
    graphs, operands: tuple, n_operands: int, labels, parent_tracer, functional: bool, facts
):
    """Return graphs that write to none of their inputs, and the written positions.

    Each graph returns the new values of the inputs some branch writes to, as in
    cond_v2 ("mutated variables become outputs"). A graph that writes to an input is
    traced again functionalized, unless it already was. Its only writes are then the
    trailing ``copy_`` nodes of functionalization. ``subgraph.writes_as_outputs``
    turns those into outputs.
    """
    writes = [subgraph.written_inputs(gm) for gm in graphs]
    if not any(writes):
        return graphs, ()
    if not functional:
        graphs = [
            _functional_retrace(gm, operands, parent_tracer, label, f) if mine else gm
            for gm, mine, label, f in zip(graphs, writes, labels, facts)
        ]
        # Functionalization may find more writes. Some ops' schemas hide a write, such
        # as batch_norm updating its running statistics in a pre-dispatch trace.
        writes = [subgraph.written_inputs(gm) for gm in graphs]
    written = tuple(sorted(set().union(*writes)))
    _check_writable(operands, n_operands, written, labels, writes)
    for gm in graphs:
        subgraph.writes_as_outputs(gm, written)
    return graphs, written


def _functional_retrace(
    gm, operands: tuple, parent_tracer, label: str, facts
) -> torch.fx.GraphModule:
    fn = functionalized_writing_back(_replaying(gm), _compat.new_functional_mode(), label)
    retraced, _ = trace_lifting(
        fn, operands, parent_tracer, user_stack_traces=False, facts=facts, label=label
    )
    return retraced


def _replaying(gm: torch.fx.GraphModule) -> Callable:
    """Return a function that runs ``gm`` node by node.

    Each node's meta (its stack trace) is current while it runs, so a trace records it."""
    from torch.fx import traceback as fx_traceback

    def run(*args):
        with fx_traceback.preserve_node_meta():
            return torch.fx.Interpreter(gm).run(*args)

    return run


def _check_writable(operands: tuple, n_operands: int, written, labels, writes) -> None:
    """Refuse writes that cannot be written back the way a Python ``if`` would make them."""
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
    """Check graphs just traced in ``tracer``'s session and fit them into one conditional.

    No graph may write to its inputs or return an alias of one. Where the graphs
    disagree on an output's strides, each returns it contiguous. A graph with no
    in-place writes counts as functional, because functionalization would not change it.
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
    """Copy ``gm`` and name its op nodes as a fresh trace of it would.

    Derivative graphs lose nodes after tracing, such as forward outputs that nothing
    reads. Their names would keep the gaps (``mul_1`` with no ``mul``). The copy also
    lets one cached graph be recorded at several nodes, each with its own module.
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


# --- tracing a function as a subgraph of the current trace, lifting closures -------


class _LiftingTracker:
    """A proxy-slot table that lifts values the parent tracer knows when a lookup misses.

    make_fx's sub-tracer bakes an unseen tensor into the subgraph as a constant. It
    fails on an unseen SymInt. Both are closures over values of the enclosing graph.
    On a miss, this table asks the parent tracer. If the parent tracks the value, the
    value becomes a new placeholder of the subgraph. The table records it so that the
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
            # A plain tensor attribute or global is a constant of the whole program. It
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
    facts: Sequence = (),
    label: str = "branch",
) -> tuple[torch.fx.GraphModule, list]:
    """Trace ``fn`` with make_fx as a subgraph of the current trace, lifting closures.

    Returns the GraphModule and ``[(value, placeholder_node), ...]`` for each lifted
    value, in order of first use. With ``user_stack_traces``, nodes carry the user's
    stack trace. Without it, they keep what the re-run graph recorded. Without
    ``lift_constants``, a real tensor unknown to the enclosing trace stays a constant
    of the subgraph. ``lift_also`` works as in ``trace_branches``.

    ``fn`` is traced assuming ``facts`` (sympy facts about sizes). Its checks that these
    facts do not settle become checks in its graph, never guards of the whole program
    (``_compat.assuming``); ``label`` names the branch in their messages.
    """
    parent = _compat.current_make_fx_tracer()
    if parent.fx_tracer is not parent_fx_tracer:
        # make_fx keeps its current tracer in a process-wide variable (2.11-2.15). With
        # two threads tracing, it can be the other thread's tracer. Entering that
        # tracer's fake mode here aborts the process. The caller's tracer comes from
        # this thread's modes.
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
        fake = _compat.fake_mode_of(args)
        assumed = _compat.assuming(getattr(fake, "shape_env", None), facts, label)
        with traces, _marking_grad_disabled_nodes(fx_tracer), assumed as branch:
            gm = _compat.trace_inner(sub, fn, branch.specialized(args))
    _compat.insert_checks(gm, branch.checks, label)
    return gm, lifted


# Node meta key. It marks a node for which the traced code itself turned grad off (a
# ``torch.no_grad()`` block). Re-running the graph to differentiate it runs such nodes
# under no_grad. They stay constants, as they are to the branch's own autograd.
GRAD_DISABLED = "torchcond_grad_disabled"
# Node meta key. It marks a node made with grad off, where the traced code did not
# turn grad off. The node is part of an autograd.Function's forward (or an
# inference_mode block). Its derivative is that Function's backward, which the graph
# does not hold.
OWN_BACKWARD = "torchcond_own_backward"


def runs_custom_forward(gm: torch.fx.GraphModule) -> bool:
    """Return whether a node of ``gm``, or of a graph nested in it, has ``OWN_BACKWARD``."""
    return any(
        node.meta.get(OWN_BACKWARD)
        for module in gm.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
    )


class _GradModeSetByCode(torch.overrides.TorchFunctionMode):
    """Track grad mode as the traced code sets it, and the ops it calls with grad off.

    ``no_grad``, ``enable_grad`` and ``set_grad_enabled`` all call the torch function
    ``torch._C._set_grad_enabled``. An autograd.Function also runs its forward with
    grad off, but does so in C++. That forward is differentiable code, so only the
    code's own switches count. The mode also keeps the ops the code calls while grad
    is off (inside such a forward) for ``_marks_own_backward``.
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


# Set while torchcond's own autograd.Function runs its forward. The operator's
# Autograd rule differentiates the conditional node it records, not a user's backward.
_IN_CONDITIONAL_FORWARD: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "torchcond_in_conditional_forward", default=False
)


@contextlib.contextmanager
def conditional_forward():
    """Mark the run of ``autograd.DifferentiableConditional.forward``.

    Grad is off there, but no user's custom backward is involved."""
    token = _IN_CONDITIONAL_FORWARD.set(True)
    try:
        yield
    finally:
        _IN_CONDITIONAL_FORWARD.reset(token)


def _marks_own_backward(node: torch.fx.Node, grad_mode: _GradModeSetByCode) -> bool:
    """Return whether ``node`` is part of a forward whose derivative the graph lacks.

    Grad was off for ``node``, but the traced code did not turn it off."""
    if _IN_CONDITIONAL_FORWARD.get():
        return False
    calling = grad_mode.calling_without_grad
    called_without_grad = bool(calling) and calling[-1] is node.target
    # An op with its own derivative (a ``torch.library`` custom op with
    # ``register_autograd``) runs below autograd with grad off. Its node is the op, so
    # re-running it with grad on runs that derivative. This does not hold if the code
    # itself called the op with grad off, inside an autograd.Function's forward.
    return called_without_grad or not _compat.has_own_derivative(node.target)


@contextlib.contextmanager
def _marking_grad_disabled_nodes(fx_tracer):
    """Mark the nodes created while the traced code has grad off.

    A trace that begins with grad off is not differentiated through, so it marks
    nothing. This happens inside an autograd.Function's forward or under the caller's
    ``no_grad``.
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
    """Make nodes record the branch's own source lines, not the line that called cond.

    Export keeps the caller's stack trace in fx's "current meta" and stamps it on every
    node it creates. While a branch is traced, this hides that stack trace. The tracer
    then records the user's frames, and the innermost frame is the branch's line.
    """
    from torch.fx import traceback as fx_traceback

    _compat.keep_stack_frames(fx_tracer)
    saved = fx_traceback.current_meta.pop("stack_trace", None)
    try:
        yield
    finally:
        # Restore into the current meta, not into the dict popped from. make_fx's
        # preserve_node_meta restores a copy of the meta it found on entry.
        if saved is not None:
            fx_traceback.current_meta["stack_trace"] = saved


def _fresh_leaf(value):
    """Return a new leaf tensor like ``value``, tracked by no tracer or autograd graph."""
    if not isinstance(value, torch.Tensor):
        return value
    return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=value.device)


def materialize_graph(fn: Callable, args: tuple) -> torch.fx.GraphModule:
    """Trace ``fn(*args)`` into a closure-free GraphModule, with autograd on.

    The inputs are fresh leaf tensors shaped like ``args``. So ``fn`` may make them
    require grad and differentiate with respect to them. Inside a make_fx session the
    graph is a subgraph of the current trace. It shares the fake mode, the shape env
    and the decompositions. Functionalization and the caller's modes are set aside
    while tracing, as in a HOP's branch tracing.
    """
    in_session = _compat.in_make_fx_session()
    parent_fx_tracer = _compat.active_fx_tracer()
    fake_mode = _compat.fake_mode_of(args)
    with contextlib.ExitStack() as stack:
        # Outer torch.func levels stay outside, because the graph is a plain function.
        stack.enter_context(_compat.every_mode_set_aside())
        if fake_mode is not None:
            stack.enter_context(fake_mode)
        with _compat.disable_proxy_modes_tracing():
            leaves = tuple(_fresh_leaf(a) for a in args)
        stack.enter_context(torch.enable_grad())
        if in_session and parent_fx_tracer is not None:
            # A constant the branch makes (``torch.tensor(2.0)``) stays in the graph.
            # The branch makes it anew on each run, so it is not a closure.
            gm, lifted = trace_lifting(
                fn, leaves, parent_fx_tracer, user_stack_traces=False, lift_constants=False
            )
            if lifted:
                raise AssertionError(f"derivative graph closed over {len(lifted)} values: {lifted}")
            return gm
        return _compat.make_fx_keeping_detach(fn, leaves)
