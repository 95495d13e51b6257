"""Branches as flat functions, and flat functions as closure-free GraphModules."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import os
import weakref
from collections.abc import Callable, Sequence
from typing import cast

import torch

from . import _compat, subgraph
from ._compat import pytree
from .errors import BranchMismatchError, CondArgumentError


def describe_structure(spec: pytree.TreeSpec) -> str:
    """A short picture of a pytree's shape, e.g. ``(Tensor, {'h': Tensor})``."""
    marker = object()
    tree = pytree.tree_unflatten([marker] * spec.num_leaves, spec)
    return _render(tree, marker)


def _render(tree, marker) -> str:
    if tree is marker:
        return "Tensor"
    if isinstance(tree, dict):
        items = ", ".join(f"{k!r}: {_render(v, marker)}" for k, v in tree.items())
        return "{" + items + "}"
    if isinstance(tree, list):
        return "[" + ", ".join(_render(v, marker) for v in tree) + "]"
    if isinstance(tree, tuple):
        inner = ", ".join(_render(v, marker) for v in tree)
        return f"({inner},)" if len(tree) == 1 else f"({inner})"
    return repr(tree)


def leaf_paths(spec: pytree.TreeSpec | None, count: int, root: str = "output") -> list[str]:
    """``output[1]['h']``-style names of a flattened pytree's leaves."""
    if spec is None:
        return [f"{root}[{i}]" for i in range(count)]
    tree = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    with_paths, _ = pytree.tree_flatten_with_path(tree)
    # A None in the tree is an output that is not there (see _NoOutput), not a leaf.
    return [root + pytree.keystr(path) for path, leaf in with_paths if leaf is not None]


class _NoOutput:
    """Stands for a ``None`` in a branch's output: part of the structure, not a leaf.

    torch's pytree makes ``None`` a leaf, which a conditional's flat outputs (tensors
    only) cannot hold. As a node with no children it is checked like any structure
    and comes back as ``None`` when the output is rebuilt, as in eager mode.
    """


pytree.register_pytree_node(_NoOutput, lambda _: ([], None), lambda _values, _context: None)
_NO_OUTPUT = _NoOutput()


def _none_as_node(out):
    return pytree.tree_map(lambda leaf: _NO_OUTPUT if leaf is None else leaf, out)


class FlatBranch:
    """A user branch seen with flat tensor operands and a flat tuple of outputs.

    Calling it records the output structure in ``out_spec``, so the caller can
    rebuild the user's pytree and report mismatches by path.
    """

    def __init__(self, fn: Callable, in_spec: pytree.TreeSpec, label: str):
        self.fn = fn
        self.in_spec = in_spec
        self.label = label
        self.out_spec: pytree.TreeSpec | None = None
        self.__name__ = getattr(fn, "__name__", label)

    def __call__(self, *flat_operands):
        operands = pytree.tree_unflatten(list(flat_operands), self.in_spec)
        try:
            out = self.fn(*operands)
        except TypeError as error:
            raise_if_arity_error(error, self.fn, self.label, operands)
            raise
        flat, spec = pytree.tree_flatten(_none_as_node(out))
        check_tensor_leaves(flat, spec, f"{self.label} output")
        self.out_spec = spec
        return tuple(flat)


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


def raise_if_arity_error(error: TypeError, fn: Callable, label: str, operands) -> None:
    """Raise a ``CondArgumentError`` naming the branch when ``fn`` cannot take the
    operands at all; return (and let ``error`` propagate) when the ``TypeError``
    came from inside the branch."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function without one
        return
    try:
        signature.bind(*operands)
    except TypeError as mismatch:
        n = len(operands)
        raise CondArgumentError(
            f"{label} is called with the {n} operand{'s' if n != 1 else ''} "
            f"(as {label}(*operands)), but its signature {signature} does not take "
            f"them: {mismatch}"
        ) from error


def check_tensor_leaves(flat: Sequence, spec: pytree.TreeSpec, what: str) -> None:
    for path, leaf in zip(leaf_paths(spec, len(flat)), flat):
        if not isinstance(leaf, torch.Tensor):
            raise BranchMismatchError(
                f"{what}: every leaf must be a torch.Tensor; "
                f"{path} is {type(leaf).__name__} ({leaf!r})"
            )


def branch_specs(branches: Sequence[Callable]) -> list[pytree.TreeSpec | None]:
    """The output structure each branch recorded, if it is a traced or flat branch."""
    return [_branch_spec(b) for b in branches]


def _branch_spec(branch) -> pytree.TreeSpec | None:
    if isinstance(branch, torch.fx.GraphModule):
        return branch.meta.get("torchcond_out_spec")
    return getattr(branch, "out_spec", None)


def check_same_structure(branches: Sequence[Callable], labels: Sequence[str]) -> None:
    """Every branch that recorded an output structure recorded the same one."""
    recorded = [(lab, s) for lab, s in zip(labels, branch_specs(branches)) if s is not None]
    for label, spec in recorded[1:]:
        first_label, first = recorded[0]
        if spec != first:
            raise BranchMismatchError(
                "branches must return the same pytree structure: "
                f"{first_label} returns {describe_structure(first)}, "
                f"{label} returns {describe_structure(spec)}"
            )


def recorded_spec(branches: Sequence[Callable]) -> pytree.TreeSpec | None:
    """The output structure the first branch that recorded one recorded."""
    return next((s for s in branch_specs(branches) if s is not None), None)


def checked_output_paths(
    branches: Sequence[Callable], labels: Sequence[str], count: int
) -> list[str]:
    """Names of the ``count`` flat outputs, once every branch agrees on the structure."""
    check_same_structure(branches, labels)
    return leaf_paths(recorded_spec(branches), count)


# --- tracing ---------------------------------------------------------------------


# graph -> weak reference to the tracer it was traced for. Weak both ways: the tracer
# reaches the graph (tracer.root holds it as a submodule), so a strong value would keep
# every traced graph, and its trace, alive for the life of the process.
_TRACED_FOR: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _lift_key(value) -> int:
    return id(value.node) if isinstance(value, torch.SymInt) else id(value)


def trace_branches(
    parent_tracer, branches: Sequence[Callable], operands: tuple, labels: Sequence[str]
) -> tuple[list[torch.fx.GraphModule], tuple]:
    """Trace every branch into a GraphModule taking the same flat inputs.

    Returns the graphs and the operands to call them with: the given operands, then
    every closed-over tensor or SymInt any branch used, deduplicated, in one order.
    Graphs this function already returned for ``parent_tracer`` (the autograd rule
    traces before the proxy rule does) come back as they are.
    """
    if all(_traced_for(b) is parent_tracer for b in branches):
        return [cast(torch.fx.GraphModule, b) for b in branches], tuple(operands)
    traced = [trace_lifting(b, operands, parent_tracer) for b in branches]
    check_same_structure(branches, labels)

    lifted: dict[int, object] = {}
    for _, branch_lifted in traced:
        for value, _node in branch_lifted:
            lifted.setdefault(_lift_key(value), value)

    input_names = operand_paths(branches, len(operands))
    graphs = []
    for (gm, branch_lifted), label, spec in zip(traced, labels, branch_specs(branches)):
        gm.meta["torchcond_out_spec"] = spec
        _align_lifted_placeholders(gm, branch_lifted, lifted, len(operands))
        subgraph.reject_input_writes(gm, label, input_names)
        subgraph.copy_aliased_outputs(gm)
        graphs.append(gm)
    subgraph.align_output_layouts(graphs)
    for gm in graphs:
        _TRACED_FOR[gm] = weakref.ref(parent_tracer)
    return graphs, tuple(operands) + tuple(lifted.values())


def _traced_for(branch):
    ref = _TRACED_FOR.get(branch)
    return ref() if ref is not None else None


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


def operand_paths(branches, n_operands: int) -> list[str]:
    """``operands[0]['h']``-style names of the flat operands, when the user's pytree is known."""
    in_spec = getattr(_flat_branch(branches[0]), "in_spec", None)
    if in_spec is None or in_spec.num_leaves != n_operands:
        return [f"operands (flattened)[{i}]" for i in range(n_operands)]
    return leaf_paths(in_spec, n_operands, root="operands")


def _flat_branch(branch):
    while not isinstance(branch, FlatBranch) and getattr(branch, "origin", None) is not None:
        branch = branch.origin
    return branch


# --- a function traced as a subgraph of the current trace, closures lifted ---------


class _LiftingTracker:
    """A proxy-slot table that, on a miss, lifts what the parent tracer knows.

    make_fx's sub-tracer bakes a tensor it has never seen into the subgraph as a
    constant, and fails on a SymInt it has never seen. Both are closures over values
    of the enclosing graph. Here a miss asks the parent tracer; when the parent tracks
    the value, it becomes a new placeholder of the subgraph and is recorded so the
    caller can pass it in as an explicit operand.
    """

    def __init__(self, base, sub_tracer, parent_tracer, lifted: list):
        self._base = base
        self._sub = sub_tracer
        self._parent = parent_tracer
        self._lifted = lifted

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
        elif _compat.is_real_tensor(key):
            # A plain tensor attribute or global: a constant of the whole program. It
            # is lifted too, so the enclosing graph owns it (export lifts constants).
            name = "closed_over_constant"
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
    fn: Callable, args: tuple, parent_fx_tracer, user_stack_traces: bool = True
) -> tuple[torch.fx.GraphModule, list]:
    """make_fx ``fn`` as a subgraph of the current trace, lifting closures.

    Returns the GraphModule and ``[(value, placeholder_node), ...]`` for every value
    lifted, in first-use order. With ``user_stack_traces`` nodes carry the user's
    stack trace; without, they keep what the graph being re-run recorded.
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
            fx_tracer, lambda table: _LiftingTracker(table, fx_tracer, parent_fx_tracer, lifted)
        )
        traces = _branch_stack_traces(fx_tracer) if user_stack_traces else contextlib.nullcontext()
        with traces, _marking_grad_disabled_nodes(fx_tracer):
            gm = _compat.trace_inner(sub, fn, args)
    return gm, lifted


# Node meta key: the traced code itself turned grad off for this node (a
# ``torch.no_grad()`` block). Re-running the graph to differentiate it runs such nodes
# under no_grad, so they stay constants, as they are to the branch's own autograd.
GRAD_DISABLED = "torchcond_grad_disabled"
# Node meta key: grad was off, but not by the traced code: the node is part of an
# autograd.Function's forward (or an inference_mode block). Its derivative is that
# Function's backward, which the graph does not hold.
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
    """Grad mode as the traced code sets it.

    ``no_grad``, ``enable_grad`` and ``set_grad_enabled`` go through
    ``torch._C._set_grad_enabled``, a torch function. An autograd.Function also runs
    its forward with grad off, but in C++: that forward is differentiable code, and
    only the code's own switches count.
    """

    def __init__(self):
        super().__init__()
        self.enabled = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is _compat.set_grad_enabled:
            self.enabled = bool(args[0])
        return func(*args, **(kwargs or {}))


# Set while torchcond's own autograd.Function runs its forward: the conditional node
# it records is differentiated by the operator's Autograd rule, not a user's backward.
_IN_CONDITIONAL_FORWARD: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "torchcond_in_conditional_forward", default=False
)


@contextlib.contextmanager
def conditional_forward():
    """Around ``autograd.Conditional.forward``: its grad-off is not a custom backward's."""
    token = _IN_CONDITIONAL_FORWARD.set(True)
    try:
        yield
    finally:
        _IN_CONDITIONAL_FORWARD.reset(token)


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
        elif not torch.is_grad_enabled() and not _IN_CONDITIONAL_FORWARD.get():
            node.meta[OWN_BACKWARD] = True
        return node

    fx_tracer.create_node = create_node_marking_grad_mode
    with grad_mode:
        yield


_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,  # torchcond
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,  # torch
)


def _user_frames(stack):
    """The frames of user code: neither torch's, torchcond's nor fx-generated."""
    import traceback

    return traceback.StackSummary.from_list(
        [
            f
            for f in stack
            if not f.filename.startswith("<eval_with_key>")  # fx's generated forward
            and not os.path.abspath(f.filename).startswith(_LIBRARY_DIRS)
        ]
    )


@contextlib.contextmanager
def _branch_stack_traces(fx_tracer):
    """Nodes record the branch's own source lines, not the line that called cond.

    Export keeps the caller's stack trace in fx's "current meta" and stamps it on
    every node it creates; while a branch is traced we hide it and let the tracer
    record the user's frames (the innermost is the branch's line).
    """
    from torch.fx import traceback as fx_traceback

    _compat.keep_stack_frames(fx_tracer, _user_frames)
    meta = fx_traceback.current_meta
    saved = meta.pop("stack_trace", None)
    try:
        yield
    finally:
        if saved is not None:
            meta["stack_trace"] = saved


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
            gm, lifted = trace_lifting(fn, leaves, parent_fx_tracer, user_stack_traces=False)
            if lifted:
                raise AssertionError(f"derivative graph closed over {len(lifted)} values: {lifted}")
            return gm
        return _compat.make_fx_keeping_detach(fn, leaves)
