"""Closures made explicit operands before autograd sees a conditional.

A branch may read parameters without receiving them. Their gradients need them as
operands of the conditional. ``lift`` makes them operands before the Autograd key's
rule runs.

Inside a make_fx session, tracing lifts the closures (``tracing.trace_branches``).
Without a tracer, as in AOTAutograd's metadata pass over fake tensors, each branch
runs once under ``StandIns``, which hears of every tensor the branch reads without
receiving or making it, in the conditionals it calls too. One that requires grad is a
closure that autograd must see. ``bind`` then makes it an explicit input, which the
branch reads through ``StandIns`` in the closure's place.

Where every branch runs (strategies.py), a branch reads a stand-in in place of each
closure, made at the first read, through ``StandIns`` too.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable, Iterable, Sequence

import torch

from .. import _compat
from .._compat import pytree
from .._compat.dynamo import raise_at_compile_time
from ..errors import UnsupportedCondError
from . import subgraph, tracing
from .kinds import ConditionalKind, is_conditional_op, pack, unpack
from .subgraph import getattr_path
from .tracing import PretracedBranch, Traced, functionalized_writing_back, plain, trace_branches


def lift(kind: ConditionalKind, selector, branches, operands: tuple):
    """Make every value a branch reads an explicit operand, so autograd sees it.

    Returns the branches to hand to the operator and its operands. A branch that
    closes over a parameter needs the parameter's gradient, but the Autograd key sees
    only the operands. Inside a make_fx session the branches are traced now, with
    closures lifted. They go on as ``PretracedBranch``s, which the rules below record
    without tracing again. Closure-free graphs of aten ops go on as they are. Without
    a tracer (fake or meta tensors alone), one run of the branches finds the closures.
    They are then bound as extra inputs (below).
    """
    tracer = _compat.active_fx_tracer()
    if all(closure_free(b) and (tracer is None or _given_as_is(plain(b))) for b in branches):
        return branches, operands
    labels = kind.labels(len(branches))
    facts = kind.branch_facts(selector, len(branches))
    if tracer is None:
        found = grad_closures(branches, operands, labels, facts)
        if not found:
            return branches, operands
        bound = [bind(b, found, len(operands)) for b in branches]
        return bound, operands + tuple(found)
    if _compat.functional_mode() is None and any(_compat.is_cpp_functional(t) for t in operands):
        # C++ functionalization is active (torch._to_functional_tensor, as older AOT
        # code uses). The tracer knows only the tensors inside the wrappers. The
        # Functionalize rule unwraps them before the proxy rule traces the branches.
        return branches, operands
    with _compat.below_autograd():
        traced = trace_in_session(tracer, branches, operands, labels, facts=facts)
    return traced.branches, traced.operands


def trace_in_session(
    tracer,
    fns: Sequence[Callable],
    operands: tuple,
    labels: Sequence[str],
    mode=None,
    lift_also: Callable[[object], bool] = tracing.lifts_nothing_else,
    facts: Sequence[Sequence] | None = None,
) -> Traced:
    """Run ``tracing.trace_branches`` on functions given autograd's view of the operands.

    The returned operands are as autograd sees them, with lifted closures last. Under
    functionalization the tracer knows the unwrapped tensors. So the functions are
    traced as the Functionalize rule would trace them, and that rule then passes the
    graphs on. Each lifted value is mapped back to its functional wrapper. ``mode`` is
    the functionalization mode when it is not the active one (the Functionalize rule).
    ``lift_also`` and ``facts`` work as in ``tracing.trace_branches``.
    """
    mode = mode or _compat.functional_mode()
    if mode is None:
        return trace_branches(tracer, fns, operands, labels, lift_also=lift_also, facts=facts)
    wrappers = Wrappers(_compat.functional_inner)
    with _compat.outside_functional_mode():
        functional = [
            functionalized_writing_back(under_modes(f, wrappers), mode, label)
            for f, label in zip(fns, labels)
        ]
        inner = _compat.unwrap_functional(operands)
        traced = trace_branches(
            tracer, functional, inner, labels, functional=True, lift_also=lift_also, facts=facts
        )
    lifted = tuple(wrappers.outer(v) for v in traced.operands[len(operands) :])
    return traced._replace(operands=operands + lifted)


def lift_under_transform(kind: ConditionalKind, branches, operands: tuple):
    """``lift`` for a torch.func transform that differentiates the conditional.

    The transform sees only the operands. So a tensor that a branch closes over would
    get no gradient, and derivative graphs traced later would close over it. The
    branches run once with the transform's levels set aside. Every tensor of a level
    that they read becomes an operand. Inside a make_fx session that run is the
    branches' trace, and its lifted closures map back to the tensors of the levels.
    Returns the branches, the operands, and the positions some branch writes to.
    """
    if all(closure_free(b) for b in branches):
        return branches, operands, ()
    tracer = _compat.active_fx_tracer()
    wrappers = Wrappers(_compat.transform_inner)
    per_example = _PerExample(_compat.fake_mode_of(operands))
    with _compat.transform_levels_set_aside(), _compat.below_autograd():
        inner = tuple(per_example.operand(t) for t in operands)
        # An operand the branch also reads from its closure is read as it receives it.
        fns = [
            under_modes(b, wrappers, StandIns(inner, per_example, zip(operands, inner)))
            for b in branches
        ]
        if tracer is not None:
            labels = kind.labels(len(branches))
            traced = trace_in_session(tracer, fns, inner, labels, lift_also=per_example.made)
            lifted = tuple(
                per_example.outer(v, wrappers.outer) for v in traced.operands[len(operands) :]
            )
            return traced.branches, operands + lifted, traced.written
        for fn in fns:  # on fake or meta tensors, where the selector is not readable
            fn(*inner)
    found = wrappers.outer_values() + per_example.outer_values()
    if not found:
        return branches, operands, ()
    return [bind(b, found, len(operands)) for b in branches], operands + found, ()


class _PerExample:
    """Makes stand-ins for tensors of torch.func levels that are set aside.

    A tensor batched by a vmap level gets a stand-in of per-example shape. A tensor
    under another level's wrapper is read as what it wraps. With the levels set aside,
    a batched tensor acts as the whole batch. A branch run on stand-ins is the
    per-example function that the levels map over. ``StandIns`` calls this object as
    its ``stand_in`` for what a branch closes over.
    """

    def __init__(self, fake_mode):
        self._fake_mode = fake_mode
        self._closures: list[tuple[torch.Tensor, torch.Tensor]] = []

    def operand(self, value):
        """Return an operand as a branch traced with the levels set aside receives it."""
        if not isinstance(value, torch.Tensor):
            return value
        if _compat.is_vmapped(value):
            return self._fresh(value)
        return _compat.functorch_base(value)

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        if _compat.is_vmapped(value):
            stand_in = self._fresh(value)
        elif _compat.is_functorch_wrapped(value):
            # A grad or jvp level's wrapper is read as what it wraps. A level that a
            # branch enters (a vmap it maps over, below) may reuse a level number that
            # was set aside.
            stand_in = _compat.functorch_base(value)
        else:
            return value
        self._closures.append((value, stand_in))
        return stand_in

    def _fresh(self, value: torch.Tensor) -> torch.Tensor:
        with _compat.disable_proxy_modes_tracing(), self._fake_mode or contextlib.nullcontext():
            return torch.empty(value.shape, dtype=value.dtype, device=value.device)

    def made(self, value) -> bool:
        return any(stand_in is value for _, stand_in in self._closures)

    def outer(self, value, otherwise: Callable):
        """Return the tensor a stand-in stands for, or ``otherwise(value)`` for others."""
        for batched, stand_in in self._closures:
            if stand_in is value:
                return batched
        return otherwise(value)

    def outer_values(self) -> tuple:
        """Return the batched tensors the branches closed over, in order of first read."""
        return tuple(batched for batched, _ in self._closures)


def _given_as_is(branch) -> bool:
    """Return whether the rules below may trace ``branch`` instead of this session.

    That holds for a graph of aten ops that writes to none of its inputs. Autograd
    must see the new values of written inputs."""
    return (
        isinstance(branch, torch.fx.GraphModule)
        and _aten_level(branch)
        and not subgraph.written_inputs(branch)
    )


def _aten_level(gm: torch.fx.GraphModule) -> bool:
    """Return whether ``gm`` calls only operators (aten, HOPs) and Python's builtins.

    A make_fx graph does so. Dynamo's branch graphs call torch-level functions
    (``F.dropout``). Traced here, they show the autograd rule the ops they run, and
    draws.py needs their random ops.
    """
    return all(
        isinstance(n.target, (_compat.OpOverload, _compat.HigherOrderOperator))
        or getattr(n.target, "__module__", None) in _BUILTIN_MODULES
        or getattr(n.target, "__name__", "").startswith(("sym_", "_sym_"))  # torch.sym_max
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method", "call_module")
    )


_BUILTIN_MODULES = frozenset({"_operator", "operator", "builtins", "math"})


def under_modes(branch, *modes):
    """Wrap ``branch`` to run under ``modes``. The last mode is innermost and sees calls first."""

    def run(*args):
        with contextlib.ExitStack() as stack:
            for mode in modes:
                stack.enter_context(mode)
            return branch(*args)

    return run


class Mapped:
    """``branch`` mapped over a batch of ``batch_size`` examples, as ``torch.vmap`` maps it.

    Every output has the batch dimension first. The operator's vmap rule calls it below
    the vmap ``level`` it maps, where tensors batched at ``level`` have no active
    level. So a tensor of that level that ``branch`` closes over is read batched at
    the new level instead. The function then closes over nothing that is unreadable
    below ``level``. It reads its batch's own tensor, which a trace lifts as any other
    closure. Unlike ``torch.vmap``, no operand needs to be batched.

    After each run, ``report(sources)`` gets one entry per output:

    * ``int`` i for the i-th argument returned unchanged;
    * a tensor that ``branch`` closes over, returned unchanged;
    * ``UNBATCHED`` for another value that is the same for every example;
    * None otherwise.
    """

    def __init__(
        self,
        branch,
        in_dims: tuple,
        batch_size: int,
        randomness: str,
        level: int | None = None,
        report: Callable[[tuple], None] | None = None,
    ):
        self.branch = branch
        self._run = tracing.logical_sizes(branch)
        self._in_dims = in_dims
        self._batch_size = batch_size
        self._randomness = randomness
        self._level = level
        self._report = report
        self.__name__ = "mapped"

    def __call__(self, *args):
        # A batched argument's own size, where there is one. A trace of this call (a
        # derivative graph) then reads the size from its inputs, not from outside.
        size = next(
            (a.size(d) for a, d in zip(args, self._in_dims) if d is not None), self._batch_size
        )
        with _compat.vmap_level(size, self._randomness) as new:
            batched = tuple(
                a if d is None else _compat.batch(a, d, new) for a, d in zip(args, self._in_dims)
            )
            read: list[tuple[torch.Tensor, torch.Tensor]] = []

            def rebatched(t: torch.Tensor) -> torch.Tensor:
                stand_in = t
                if self._level is not None and _compat.batched_at(t, self._level):
                    physical, dim = _compat.unbatch(t, self._level)
                    stand_in = _batched(physical, dim, new)
                read.append((t, stand_in))
                return stand_in

            # A closure-free graph reads only its inputs, so no closure needs rebatching.
            free = closure_free(self.branch)
            with contextlib.nullcontext() if free else StandIns(batched, rebatched):
                outs = tuple(self._run(*batched))
            if self._report is not None:
                self._report(tuple(_source(o, batched, read, new) for o in outs))
            return tuple(_compat.remove_batch_dim(o, new, size, 0) for o in outs)


def _batched(t: torch.Tensor, dim: int, level: int) -> torch.Tensor:
    """Batch ``t`` along ``dim`` at vmap ``level``. This is a torch function, so the
    modes a ``Mapped`` branch runs under (``lift_under_transform``'s) see ``t`` read."""
    if torch.overrides.has_torch_function((t,)):
        return torch.overrides.handle_torch_function(_batched, (t,), t, dim, level)
    return _compat.batch(t, dim, level)


# What ``Mapped`` reports for an output the same for every example of the batch.
UNBATCHED = "unbatched"


def _source(out, args: tuple, read: list, level: int):
    """Return what ``out`` is, in the terms of ``Mapped``'s report."""
    for i, a in enumerate(args):
        if out is a:
            return i
    for closure, stand_in in read:
        if out is stand_in:
            return closure
    return None if _compat.batched_at(out, level) else UNBATCHED


def closure_free(branch) -> bool:
    """Return whether ``branch`` reads nothing but its inputs and nested branch graphs.

    That holds for such a GraphModule, or for such a function mapped by vmap."""
    if isinstance(branch, Mapped):
        return closure_free(branch.branch)
    if isinstance(branch, PretracedBranch):
        return True
    if not isinstance(branch, torch.fx.GraphModule):
        return False
    for node in branch.graph.find_nodes(op="get_attr"):
        if not isinstance(getattr_path(branch, node.target), torch.fx.GraphModule):
            return False
    return True


def grad_closures(
    branches: Sequence[Callable], operands: tuple, labels: Sequence[str], facts: Sequence
) -> list[torch.Tensor]:
    """Return the tensors that some branch reads without receiving, and that require grad,
    in order of first read. Each branch runs assuming its ``facts``
    (``tracing.trace_branches``). Conditionals it calls count as its own code."""
    found: dict[int, torch.Tensor] = {}  # Holding each tensor keeps its id unique.

    def note(t: torch.Tensor) -> torch.Tensor:
        if t.requires_grad:
            found.setdefault(id(t), t)
        return t

    env = getattr(_compat.fake_mode_of(operands), "shape_env", None)
    with torch.no_grad():
        for branch, label, f in zip(branches, labels, facts):
            with _compat.assuming(env, f, label) as assumed:
                args = assumed.specialized(operands)
                with StandIns(args, note, properties=True):
                    branch(*args)
    return list(found.values())


def bind(branch: Callable, closures: Sequence[torch.Tensor], n_operands: int) -> Callable:
    """Wrap ``branch`` to take ``(*operands, *closure_values)``. It reads each value where
    it reads its closure, in conditionals it calls too."""

    def bound(*args):
        operands = args[:n_operands]
        pairs = zip(closures, args[n_operands:])
        with StandIns(operands, _as_itself, pairs, properties=True):
            return branch(*operands)

    return bound


def _as_itself(t: torch.Tensor) -> torch.Tensor:
    return t


# What changes a tensor's autograd state, which no op carries, named as the refusal
# names it (state.refuse_autograd_state). Checked on torch 2.11-2.15.
_AUTOGRAD_STATE = {
    inspect.getattr_static(torch.Tensor, "data").__set__: ".data =",
    inspect.getattr_static(torch.Tensor, "grad").__set__: ".grad =",
    inspect.getattr_static(torch.Tensor, "grad").__delete__: "del .grad",
    inspect.getattr_static(torch.Tensor, "requires_grad").__set__: ".requires_grad =",
    torch.Tensor.requires_grad_: "requires_grad_",
    torch.Tensor.retain_grad: "retain_grad",
    torch.Tensor.register_hook: "register_hook",
    torch.Tensor.register_post_accumulate_grad_hook: "register_post_accumulate_grad_hook",
}


class StandIns(torch.overrides.TorchFunctionMode):
    """While active, a branch reads ``stand_in(t)`` in place of each tensor ``t`` it
    closes over. The stand-in is made at the first read. ``stand_in`` may return ``t``.
    A change of ``t``'s autograd state (``t.grad = g``) would land on the stand-in, so
    ``changing(t, what)`` is called first, and may raise.

    A tensor is closed over when it is neither ``given`` (the branch's inputs) nor
    made under this mode. The branches of a conditional called under it also run under
    it, so what they close over is replaced too. ``read_as`` holds pairs ``(t, u)``.
    The branch reads ``t`` as ``u``, one of ``given``. ``t`` is an operand as the caller
    holds it, and ``u`` is the operand as the branch receives it.

    torch.compile may trace code inside the branch: eagerly, ``torch.cond`` compiles
    itself. What this mode knows of tensors cannot be read in that trace. With
    ``swaps``, a test of whether ``stand_in`` may replace a tensor that torch.compile
    can trace, such a call reads every tensor as itself and refuses one that passes
    the test (``_traced_inside``). Without it, the call is refused.

    A property read (``t.T``, ``t.shape``) reads ``t`` itself, unless ``properties``:
    then it reads the stand-in, as every other call does.
    """

    def __init__(
        self,
        given: Sequence,
        stand_in: Callable[[torch.Tensor], torch.Tensor],
        read_as: Iterable[tuple] = (),
        changing: Callable[[torch.Tensor, str], None] | None = None,
        swaps: Callable[[torch.Tensor], bool] | None = None,
        properties: bool = False,
    ):
        super().__init__()
        self.stand_in = stand_in
        self.properties = properties
        self.changing = changing
        self.swaps = swaps
        self.kept = _ByIdentity()
        for t in given:
            if isinstance(t, torch.Tensor):
                self.kept.put(t, t)
        self.swapped = _ByIdentity()
        for t, u in read_as:
            if isinstance(t, torch.Tensor) and t is not u:
                self.swapped.put(t, u)
        # Weak, so the branch's intermediates are freed as they would be without it.
        self.made = _ByIdentity(weak=True)

    def read_as(self, t: torch.Tensor, u: torch.Tensor) -> None:
        """From now on, read ``u`` where the branch reads ``t``."""
        if t is not u:
            self.swapped.put(t, u)
            self.kept.put(u, u)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _compat.is_dynamo_compiling() and not self.kept.listed:
            return self._traced_inside(func, args, kwargs or {})
        if not self.properties and getattr(func, "__name__", None) == "__get__":
            # Where stand-ins mask gradients, a property that reads no value
            # (requires_grad, _version) needs none. Checks inside the branch read such
            # properties from tensors that are not its own, such as an operand under
            # its torch.func wrappers. A tensor a property returns (t.T) is read
            # through a stand-in of its own where the branch uses it.
            return func(*args, **(kwargs or {}))
        if self.changing is not None and func in _AUTOGRAD_STATE and self._closed_over(args[0]):
            self.changing(args[0], _AUTOGRAD_STATE[func])
        args, kwargs = pytree.tree_map_only(torch.Tensor, self._swap, (args, kwargs or {}))
        if is_conditional_op(func) and _compat.is_dynamo_compiling():
            # Dynamo refuses a mode that is entered, or that changes its state, inside
            # the branches it speculates. Instead, dynamo reads what they close over
            # through ``_swap`` once they are traced (_compat/dynamo.py).
            with _compat.torch_function_disabled():
                out = func(*args, closures_read_as=self._swap, **kwargs)
        else:
            if is_conditional_op(func):
                selector, branches, operands = unpack(args)
                args = pack(selector, [self._within(b) for b in branches], operands)
            out = func(*args, **kwargs)
        for value in pytree.tree_leaves(out):
            if isinstance(value, torch.Tensor) and self.kept.get(value) is None:
                self.made.put(value, value)
        return out

    def _traced_inside(self, func, args, kwargs):
        """Call ``func`` as torch.compile traces it inside the branch, where this mode
        was entered eagerly. Every tensor is read as itself, which is what the mode
        does with a tensor that ``swaps`` rejects. A tensor that it accepts is refused,
        and so is a higher-order operator while a gradient may be taken, since the
        tensors its branches close over never reach this mode."""
        tensors = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        operator = isinstance(func, _compat.HigherOrderOperator) and torch.is_grad_enabled()
        if operator or any(self.swaps is None or self.swaps(t) for t in tensors):
            raise_at_compile_time(
                UnsupportedCondError,
                "a conditional's branch calls code that torch.compile traces "
                "(torch.cond compiles itself) while a gradient may be taken, and "
                "torchcond reads the tensors that branch closes over through stand-ins, "
                "which torch.compile cannot trace. The stand-ins keep the other branch's "
                "examples out of the gradient where every branch runs (strategy='select', "
                "or vmap with a per-example predicate), and find the closures where a "
                "conditional is differentiated without a tracer (fake or meta tensors). "
                "Use torchcond.cond there, or call the conditional under torch.no_grad()",
            )
        return func(*args, **kwargs)

    def _swap(self, value: torch.Tensor) -> torch.Tensor:
        swapped = self.swapped.get(value)
        if swapped is not None:
            return swapped
        if not self._closed_over(value):
            return value
        stand_in = self.stand_in(value)
        self.swapped.put(value, stand_in)
        self.kept.put(stand_in, stand_in)
        return stand_in

    def _own(self, value: torch.Tensor) -> bool:
        return self.kept.get(value) is not None or self.made.get(value) is not None

    def _closed_over(self, value: torch.Tensor) -> bool:
        if self._own(value):
            return False
        # A torch.func level's wrapper of a tensor the branch owns is also its own.
        # Dynamo shows no such wrappers.
        return _compat.is_dynamo_compiling() or not self._own(_compat.functorch_base(value))

    def _within(self, branch):
        # A closure-free graph reads nothing to replace.
        if closure_free(branch):
            return branch

        def run(*args):
            # The branch receives the conditional's operands, which this mode has
            # already swapped. They are its own inputs, not tensors it closes over.
            for arg in args:
                if isinstance(arg, torch.Tensor):
                    self.kept.put(arg, arg)
            with self:
                return branch(*args)

        return run


class _ByIdentity:
    """A map keyed by tensor identity.

    Eagerly it keys by ``id``. It holds the key, so the id stays unique. With ``weak``,
    the value is the key itself, and an entry goes when its key is freed. Under dynamo
    it compares with ``is``. Dynamo cannot take the id of a tensor made in the trace on
    every release (2.11), and it traces no weakref."""

    def __init__(self, weak: bool = False):
        self.listed = _compat.is_dynamo_compiling()
        self.weak = weak and not self.listed
        self.pairs: list = []
        self.by_id: dict | weakref.WeakValueDictionary = (
            weakref.WeakValueDictionary() if self.weak else {}
        )

    def get(self, key: torch.Tensor):
        if self.listed:  # newest first, since a branch mostly reads what it just made
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


class Wrappers(torch.overrides.TorchFunctionMode):
    """Records every wrapper tensor passed to a torch function, keyed by what it wraps.

    The tracer knows unwrapped tensors, while autograd or a torch.func transform knows
    their wrappers. ``inner_of(value)`` returns what ``value`` wraps, or None if it is
    no such wrapper. ``outer`` maps a closure lifted from the trace back to its wrapper.
    """

    def __init__(self, inner_of: Callable):
        super().__init__()
        self._inner_of = inner_of
        self._by_inner: dict[int, tuple] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        for value in pytree.tree_leaves((args, kwargs)):
            inner = self._inner_of(value)
            if inner is not None:
                self._by_inner[id(inner)] = (inner, value)
        return func(*args, **(kwargs or {}))

    def outer_values(self) -> tuple:
        """Return every recorded wrapper, in order of first use."""
        return tuple(outer for _, outer in self._by_inner.values())

    def outer(self, value):
        hit = self._by_inner.get(id(value))
        return value if hit is None else hit[1]
