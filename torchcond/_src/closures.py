"""Closures made explicit operands before autograd sees a conditional.

A branch may read parameters without receiving them; their gradients need them as
operands of the conditional. ``lift`` does it before the Autograd key's rule runs.

Inside a make_fx session closures are lifted by tracing (``tracing.trace_branches``).
With no tracer, as in AOTAutograd's metadata pass over fake tensors, a branch is run
once while every tensor handed to a torch function is recorded; a tensor the branch
neither received nor produced, and that requires grad, is a closure autograd must
see. ``bind`` then makes it an explicit input: the branch runs with each such tensor
replaced, at every torch function call, by the value passed in its place.

Where every branch runs (strategies.py), a branch's closures are found as it runs:
under ``StandIns`` it reads, in place of each, a stand-in made at the first read.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch

from .. import _compat
from .._compat import pytree
from . import subgraph
from .forms import Form, is_conditional_op, pack, unpack
from .subgraph import getattr_path
from .tracing import SessionGraph, Traced, functionalized, plain, trace_branches


def lift(form: Form, branches, operands: tuple):
    """Make every value a branch reads an explicit operand, so autograd sees it.

    Returns the branches to hand to the operator and its operands. A branch that
    closes over a parameter needs the parameter's gradient, but the Autograd key sees
    only the operands. Inside a make_fx session the branches are traced now, with
    closures lifted, and handed on as ``SessionGraph``s, which the rules below record
    without tracing again. Closure-free graphs of aten ops are handed on as they are.
    Without a tracer (fake or meta tensors alone) closures are found by running the
    branches once and bound as extra inputs (below).
    """
    tracer = _compat.active_fx_tracer()
    if all(closure_free(b) and (tracer is None or _given_as_is(plain(b))) for b in branches):
        return branches, operands
    if tracer is None:
        found = grad_closures(branches, operands)
        if not found:
            return branches, operands
        bound = [bind(b, found, len(operands)) for b in branches]
        return bound, operands + tuple(found)
    if _compat.functional_mode() is None and any(_compat.is_cpp_functional(t) for t in operands):
        # C++ functionalization (torch._to_functional_tensor, as older AOT code uses):
        # the tracer knows only the tensors inside the wrappers, which the
        # Functionalize rule unwraps before the proxy rule traces the branches.
        return branches, operands
    with _compat.below_autograd():
        traced = trace_in_session(tracer, branches, operands, form.labels(len(branches)))
    return traced.branches, traced.operands


def trace_in_session(
    tracer, fns: Sequence[Callable], operands: tuple, labels: Sequence[str], mode=None
) -> Traced:
    """``tracing.trace_branches`` for functions called with autograd's view of the operands.

    The operands it returns are as autograd sees them, lifted closures last. Under
    functionalization the tracer knows the unwrapped tensors: the functions are
    traced as the Functionalize rule would trace them (which then passes the graphs
    on), and what was lifted is mapped back to its functional wrapper. ``mode``: the
    functionalization mode, where it is not the active one (the Functionalize rule).
    """
    mode = mode or _compat.functional_mode()
    if mode is None:
        return trace_branches(tracer, fns, operands, labels)
    wrappers = FunctionalWrappers()
    with _compat.outside_functional_mode():
        functional = [
            functionalized(_recording(f, wrappers), mode, label) for f, label in zip(fns, labels)
        ]
        inner = _compat.unwrap_functional(operands)
        traced = trace_branches(tracer, functional, inner, labels, functional=True)
    lifted = tuple(wrappers.outer(v) for v in traced.operands[len(operands) :])
    return traced._replace(operands=operands + lifted)


def _given_as_is(branch) -> bool:
    """A graph the rules below may trace, rather than this session now: one of aten
    ops that writes to none of its inputs (whose new values autograd must see)."""
    return _aten_level(branch) and not subgraph.written_inputs(branch)


def _aten_level(gm: torch.fx.GraphModule) -> bool:
    """Calls only operators (aten, HOPs) and Python's builtins, as a make_fx graph does.

    Dynamo's branch graphs call torch-level functions (``F.dropout``); traced here,
    the autograd rule sees the ops they run (draws.py needs their random ops).
    """
    return all(
        isinstance(n.target, (_compat.OpOverload, _compat.HigherOrderOperator))
        or getattr(n.target, "__module__", None) in _BUILTIN_MODULES
        or getattr(n.target, "__name__", "").startswith(("sym_", "_sym_"))  # torch.sym_max
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method", "call_module")
    )


_BUILTIN_MODULES = frozenset({"_operator", "operator", "builtins", "math"})


def _recording(branch, mode):
    def run(*args):
        with mode:
            return branch(*args)

    return run


def closure_free(branch) -> bool:
    """A GraphModule that reads nothing but its placeholders (and nested branch graphs)."""
    if isinstance(branch, SessionGraph):
        return True
    if not isinstance(branch, torch.fx.GraphModule):
        return False
    for node in branch.graph.find_nodes(op="get_attr"):
        if not isinstance(getattr_path(branch, node.target), torch.fx.GraphModule):
            return False
    return True


class _Recorder(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.read: dict[int, torch.Tensor] = {}
        self.made: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        for value in pytree.tree_leaves((args, kwargs)):
            if isinstance(value, torch.Tensor) and id(value) not in self.made:
                self.read.setdefault(id(value), value)
        out = func(*args, **(kwargs or {}))
        for value in pytree.tree_leaves(out):
            if isinstance(value, torch.Tensor):
                self.made.add(id(value))
        return out


def grad_closures(branches: Sequence[Callable], operands: tuple) -> list[torch.Tensor]:
    """Tensors that some branch reads without receiving them, and that require grad."""
    recorder = _Recorder()
    with torch.no_grad(), recorder:
        for branch in branches:
            branch(*operands)
    given = {id(t) for t in operands}
    return [t for key, t in recorder.read.items() if key not in given and t.requires_grad]


class _Substitute(torch.overrides.TorchFunctionMode):
    def __init__(self, replacements: dict[int, torch.Tensor]):
        super().__init__()
        self.replacements = replacements

    def __torch_function__(self, func, types, args=(), kwargs=None):
        def swap(value):
            return self.replacements.get(id(value), value)

        args, kwargs = pytree.tree_map_only(torch.Tensor, swap, (args, kwargs or {}))
        return func(*args, **kwargs)


def bind(branch: Callable, closures: Sequence[torch.Tensor], n_operands: int) -> Callable:
    """``branch`` taking ``(*operands, *closure_values)``."""

    def bound(*args):
        values = args[n_operands:]
        with _Substitute({id(c): v for c, v in zip(closures, values)}):
            return branch(*args[:n_operands])

    return bound


class StandIns(torch.overrides.TorchFunctionMode):
    """While active, a branch reads ``stand_in(t)`` in place of each tensor ``t`` it
    closes over, made at the first read; ``stand_in`` may return ``t`` itself.

    A tensor is closed over when it is neither ``given`` (the branch's inputs) nor
    made under this mode. The branches of a conditional called under it run under it
    too, so what they close over is replaced as well.
    """

    def __init__(self, given: Sequence, stand_in: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.stand_in = stand_in
        self.kept = _ByIdentity()
        for t in given:
            if isinstance(t, torch.Tensor):
                self.kept.put(t, t)
        self.swapped = _ByIdentity()
        # Weak, so the branch's intermediates are freed as they would be without it.
        self.made = _ByIdentity(weak=True)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        args, kwargs = pytree.tree_map_only(torch.Tensor, self._swap, (args, kwargs or {}))
        if is_conditional_op(func):
            selector, branches, operands = unpack(args)
            args = pack(selector, [self._within(b) for b in branches], operands)
        out = func(*args, **kwargs)
        for value in pytree.tree_leaves(out):
            if isinstance(value, torch.Tensor) and self.kept.get(value) is None:
                self.made.put(value, value)
        return out

    def _swap(self, value: torch.Tensor) -> torch.Tensor:
        swapped = self.swapped.get(value)
        if swapped is not None:
            return swapped
        if self.kept.get(value) is not None or self.made.get(value) is not None:
            return value
        stand_in = self.stand_in(value)
        self.swapped.put(value, stand_in)
        self.kept.put(stand_in, stand_in)
        return stand_in

    def _within(self, branch):
        # A closure-free graph reads nothing to replace.
        if closure_free(branch):
            return branch

        def run(*args):
            with self:
                return branch(*args)

        return run


class _ByIdentity:
    """Values keyed by tensors' identity: by ``id`` eagerly (holding the key, so its id
    stays its own; or, ``weak``, dropping an entry when its key is freed, the value
    being the key itself); by ``is`` under dynamo, which cannot take the id of a tensor
    made in the trace on every release (2.11) and traces no weakref."""

    def __init__(self, weak: bool = False):
        self.listed = _compat.is_dynamo_compiling()
        self.weak = weak and not self.listed
        self.pairs: list = []
        self.by_id: dict | weakref.WeakValueDictionary = (
            weakref.WeakValueDictionary() if self.weak else {}
        )

    def get(self, key: torch.Tensor):
        if self.listed:  # newest first: a branch mostly reads what it just made
            for k, value in reversed(self.pairs):
                if k is key:
                    return value
            return None
        hit = self.by_id.get(id(key))
        if self.weak:
            return hit if hit is key else None
        return hit[1] if hit is not None else None

    def put(self, key: torch.Tensor, value) -> None:
        if self.listed:
            self.pairs.append((key, value))
        else:
            self.by_id[id(key)] = value if self.weak else (key, value)


class FunctionalWrappers(torch.overrides.TorchFunctionMode):
    """Records every functional tensor passed to a torch function, by what it wraps.

    The tracer knows unwrapped tensors; autograd knows their functional wrappers.
    A closure lifted from a functionalized trace is mapped back with ``outer``.
    """

    def __init__(self):
        super().__init__()
        self._by_inner: dict[int, tuple] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        for value in pytree.tree_leaves((args, kwargs)):
            inner = _compat.functional_inner(value)
            if inner is not None:
                self._by_inner[id(inner)] = (inner, value)
        return func(*args, **(kwargs or {}))

    def outer(self, value):
        hit = self._by_inner.get(id(value))
        return value if hit is None else hit[1]
