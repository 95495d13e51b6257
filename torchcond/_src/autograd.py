"""Differentiation of the conditional operators, to any order.

A selector readable on the host makes the conditional a Python ``if``. The taken
branch runs under ordinary autograd. So gradients, double backward and every
torch.func transform behave exactly as they do for that ``if``.

Otherwise (tracing, fake or meta selectors) the derivative of a conditional is a
conditional on the same selector:

* reverse mode: ``op(selector, *vjp_graphs, used_primals + cotangents)``, where
  each ``vjp_graph`` is a branch's vector-Jacobian product;
* forward mode: ``op(selector, *jvp_graphs, primals + tangents)``.

Those graphs are closure-free and call the operator again, so they differentiate
the same way. A second derivative is a conditional of conditionals. The graphs are
traced once per forward graph and input signature (``_cache``). A vjp graph
recomputes the branch from its inputs. So the backward keeps only two kinds of
values. The first kind is the primals that some branch's vjp reads. Unread primals
are pruned before the node is built. The second kind is the random draws of
branches that draw, which the recomputation replays (draws.py).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.autograd.forward_ad as forward_ad

from .. import _compat
from .._compat import pytree
from ..errors import UnsupportedCondError
from . import closures, draws
from .batching import map_conditional
from .closures import closure_free
from .host import host_readable
from .kinds import ConditionalKind
from .subgraph import is_symbolic_scalar, symbols_of
from .tracing import (
    GRAD_DISABLED,
    OWN_BACKWARD,
    conditional_forward,
    materialize_graph,
    pending_writes,
    plain,
    pretraced_branches,
    refuse_writes_under_transform,
    renamed_copy,
    runs_custom_forward,
    written_back,
)

# --- the Autograd-key rule -----------------------------------------------------------


def autograd_rule(kind: ConditionalKind, selector, branches, operands):
    if not torch.is_grad_enabled():
        return kind.call_below_autograd(selector, branches, operands)
    if host_readable(selector):
        return kind.taken_branch(selector, branches)(*operands)
    n = len(operands)
    lifted, operands = closures.lift(kind, selector, branches, tuple(operands))
    if not any(_requires_grad(t) or _compat.has_tangent(t) for t in operands):
        return kind.call_below_autograd(selector, lifted, operands)
    # The conditional returns the new values of written operands as differentiable
    # outputs. They are written back here, where autograd sees the write. Derivatives
    # recompute the branches from the operands the forward saw. So a written operand
    # goes in as a copy, which the write-back leaves alone.
    written, lifted = pending_writes(lifted)
    derivative = None if written else _derivative_source(branches, lifted, operands[n:])
    inputs = tuple(_old_value(t) if i in written else t for i, t in enumerate(operands))
    graphs = [plain(b) for b in lifted]
    drawn = draws.saved_for_derivative(graphs, kind.labels(len(lifted)))
    if drawn is not None:
        out = DifferentiableConditional.apply(
            kind, selector, drawn.forward, (drawn.replay, drawn.n_draws), *inputs
        )
        out = out[: len(out) - drawn.n_draws]
    else:
        out = DifferentiableConditional.apply(kind, selector, tuple(lifted), derivative, *inputs)
    return written_back(out, written, lambda w, new: operands[w].copy_(new))


# Under AOTAutograd (functionalized), the old value of a written operand is this opaque
# op, which is saved for the backward. Inductor removes a ``clone`` whose metadata
# matches its source, and its partitioner may recompute one in the backward. Either
# way, the backward would read the operand after the write-back (torch 2.11-2.15).
@torch.library.custom_op("torchcond::old_value", mutates_args=())
def _old_value_op(t: torch.Tensor) -> torch.Tensor:
    return t.clone()


_old_value_op.register_fake(torch.empty_like)
_old_value_op.register_autograd(lambda ctx, grad: grad)
_old_value_op.register_vmap(lambda info, in_dims, t: (_old_value_op(t), in_dims[0]))


def _old_value(t: torch.Tensor) -> torch.Tensor:
    """Copy operand ``t`` before a branch writes to it, for the derivatives to read."""
    return _old_value_op(t) if _compat.functional_mode() is not None else t.clone()


class FromUserBranches(NamedTuple):
    """Derivatives traced from the user's branches, which read ``closures`` themselves.
    Derivatives for the lifted closure operands are taken for those closures."""

    branches: tuple
    closures: tuple


def _derivative_source(branches, lifted, closed_over: tuple):
    """Return what derivatives differentiate instead of the forward graphs ``lifted``.

    None means the forward graphs. The caller never asks when the branches write to
    their inputs. The traced graphs then return the new values, and a derivative that
    recomputes a branch may not write.
    """
    lifted = [plain(b) for b in lifted]
    if all(closure_free(b) for b in branches):
        # Graphs as given (dynamo's call torch functions) are differentiated as they
        # are. A custom autograd.Function in them runs its own backward.
        return (tuple(plain(b) for b in branches), 0)
    if any(isinstance(g, torch.fx.GraphModule) and runs_custom_forward(g) for g in lifted):
        # A custom autograd.Function ran in a traced branch. Its backward is in no
        # graph, but it runs when the user's branch is differentiated.
        return FromUserBranches(tuple(branches), closed_over)
    return None


def functorch_rule(kind: ConditionalKind, selector, branches, operands):
    """Apply torch.func grad/vjp/jvp to a conditional whose selector is not readable.

    ``DifferentiableConditional`` is a functorch-aware autograd.Function
    (``setup_context`` form), so the transform differentiates it with the rules below."""
    n = len(operands)
    lifted, operands, written = closures.lift_under_transform(kind, branches, tuple(operands))
    refuse_writes_under_transform(written, n, kind.labels(len(branches)))
    derivative = _derivative_source(branches, lifted, operands[n:])
    return DifferentiableConditional.apply(kind, selector, tuple(lifted), derivative, *operands)


def with_tangents(outputs) -> tuple:
    """Make each floating output of a branch taken under torch.func's jvp a dual tensor.

    An output with no tangent from the branch (a constant it makes) gets zeros. When
    traced, the conditional's outputs have tangents whichever branch is taken. Code
    compiled around it (dynamo's jvp) reads them as it found them in the trace.
    torch.func's jvp runs at forward-AD level 0, the only level torch has. Compiled
    code enters that level without ``forward_ad.dual_level``.
    """
    return tuple(
        forward_ad.make_dual(t, torch.zeros_like(t), level=0)
        if isinstance(t, torch.Tensor)
        and _differentiable(t)
        and forward_ad.unpack_dual(t, level=0).tangent is None
        else t
        for t in outputs
    )


def _requires_grad(value) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


def _differentiable(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


# --- the derivative of a conditional is a conditional ---------------------------------


class DifferentiableConditional(torch.autograd.Function):
    """``op(selector, *branches, operands)`` with derivatives that are conditionals.

    ``derivative`` takes one of three forms:

    * None. Derivatives differentiate ``branches``.
    * ``(graphs, n_draws)``. Derivatives differentiate ``graphs``, which compute the
      same functions as ``branches``. With ``n_draws``, ``branches`` also return
      their random draws as the last outputs. ``graphs`` take them after the
      operands, so derivatives replay the forward's draws (draws.py).
    * A ``FromUserBranches``. Inside a make_fx session, derivatives are traced from
      the user's branches.
    """

    @staticmethod
    def forward(kind, selector, branches, derivative, *operands):
        with conditional_forward():
            return tuple(kind.call_below_autograd(selector, branches, operands))

    @staticmethod
    def setup_context(ctx, inputs, output):
        kind, selector, branches, derivative, *operands = inputs
        ctx.kind, ctx.n_operands = kind, len(operands)
        ctx.from_user_branches = derivative if isinstance(derivative, FromUserBranches) else None
        own = derivative is None or ctx.from_user_branches is not None
        ctx.branches, ctx.n_draws = ([plain(b) for b in branches], 0) if own else derivative
        ctx.set_materialize_grads(False)
        n_out = len(output) - ctx.n_draws
        ctx.differentiable = [_differentiable(t) and j < n_out for j, t in enumerate(output)]
        ctx.mark_non_differentiable(*[t for t, d in zip(output, ctx.differentiable) if not d])
        values = (selector, *operands, *output[n_out:])
        ctx.tensor_at = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
        ctx.others = [v for v in values if not isinstance(v, torch.Tensor)]
        tensors = [values[i] for i in ctx.tensor_at]
        ctx.save_for_backward(*tensors)
        ctx.save_for_forward(*tensors)

    @staticmethod
    def backward(ctx, *cotangents):
        selector, primals = _saved(ctx)
        need = [i for i in range(ctx.n_operands) if ctx.needs_input_grad[4 + i]]
        present = [j for j, g in enumerate(cotangents) if g is not None and ctx.differentiable[j]]
        grads: list = [None] * ctx.n_operands
        if need and present:
            given = [cotangents[j] for j in present]
            out = _from_user_branches(
                ctx, selector, primals, given, lambda b, n, c: _vjp_of(b, n, need, present, c)
            )
            if out is None:
                (graphs, used), built_in = vjp_graphs(ctx.branches, primals, need, present, given)
                args = tuple((*primals, *given)[k] for k in used)
                out = ctx.kind.op(selector, *_recordable(ctx.kind, graphs, built_in), args)
            for i, g in zip(need, out):
                grads[i] = g
        return (None, None, None, None, *grads)

    @staticmethod
    def vmap(info, in_dims, kind, selector, branches, derivative, *operands):
        # torch.func's jacrev and hessian vmap the backward over basis cotangents.
        # Per-example gradients vmap it over a batched selector.
        out = map_conditional(
            kind,
            selector,
            in_dims[1],
            branches,
            operands,
            in_dims[4:],
            info.batch_size,
            info.randomness,
        )
        return out, (0,) * len(out)

    @staticmethod
    def jvp(ctx, _form_t, _selector_t, _branches_t, _derivative_t, *tangents):
        selector, primals = _saved(ctx)
        have = [i for i, t in enumerate(tangents) if t is not None]
        if not have:
            return tuple(None for _ in ctx.differentiable)
        given = [tangents[i] for i in have]
        out = _from_user_branches(
            ctx, selector, primals, given, lambda b, n, c: _user_jvp_of(b, n, have, c)
        )
        if out is None:
            graphs, built_in = jvp_graphs(ctx.branches, primals, have, given)
            out = ctx.kind.op(
                selector, *_recordable(ctx.kind, graphs, built_in), (*primals, *given)
            )
        out = (*out, *(None,) * ctx.n_draws)
        return tuple(t if d else None for t, d in zip(out, ctx.differentiable))


def _saved(ctx):
    """Return the saved selector, and the operands followed by the saved draws.

    The second value is what ``ctx.branches`` take."""
    values: list = [None] * (1 + ctx.n_operands + ctx.n_draws)
    saved = iter(ctx.saved_tensors)
    others = iter(ctx.others)
    tensor_at = set(ctx.tensor_at)
    for i in range(len(values)):
        values[i] = next(saved) if i in tensor_at else next(others)
    return values[0], tuple(values[1:])


# --- derivative graphs -------------------------------------------------------------


def vjp_graphs(branches, primals, need, present, cotangents):
    """Build one vjp graph per branch, all taking the same pruned inputs.

    Each graph maps ``(*primals, *cotangents)``, restricted to ``used``, to the
    gradients of the primals in ``need``. An input that a branch does not use gets
    zeros, because every branch must return the same structure.
    """
    args = (*primals, *cotangents)
    key = ("vjp", tuple(need), tuple(present), _signature(args))

    def build():
        graphs = [
            _derivative_graph(_vjp_of(b, len(primals), need, present), args) for b in branches
        ]
        return graphs, _prune_unused_inputs(graphs)

    return _cache(branches, key, build)


def jvp_graphs(branches, primals, have, tangents):
    """Build one jvp graph per branch, mapping ``(*primals, *tangents)`` to output tangents."""
    args = (*primals, *tangents)
    key = ("jvp", tuple(have), _signature(args))

    def build():
        return [_derivative_graph(_jvp_of(b, len(primals), have), args) for b in branches]

    return _cache(branches, key, build)


def _vjp_of(
    branch: Callable,
    n: int,
    need: Sequence[int],
    present: Sequence[int],
    closed_over: Sequence[torch.Tensor] = (),
):
    """Return a function from ``(*primals[:n], *cotangents)`` to the gradients in ``need``.

    An input past the first ``n`` is a closure of ``branch``, found in ``closed_over``."""

    def vjp(*args):
        primals, wrt = _leaves(args[:n], need, closed_over)
        cotangents = args[n:]
        outputs = _run_differentiably(branch, primals)
        pairs = [(outputs[j], g) for j, g in zip(present, cotangents) if outputs[j].requires_grad]
        grads: tuple[torch.Tensor | None, ...]
        if pairs:
            # With create_graph, the backward's ops run with grad on, as the code's own
            # forward did. So only its no_grad blocks are marked grad-disabled, and a
            # second derivative goes through the rest.
            grads = torch.autograd.grad(
                [o for o, _ in pairs],
                wrt,
                [g for _, g in pairs],
                allow_unused=True,
                create_graph=True,
            )
        else:
            grads = (None,) * len(wrt)
        return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(wrt, grads))

    return vjp


def _user_jvp_of(branch: Callable, n: int, have: Sequence[int], closed_over: Sequence):
    """``_jvp_of`` for a user's branch under torch.func's jvp: forward mode, so that a
    custom Function's own ``jvp`` runs (it may have no backward). A tangent for a
    closure needs reverse mode."""
    if not _compat.torch_func_level_active() or any(i >= n for i in have):
        return _jvp_of(branch, n, have, closed_over)

    def jvp(*args):
        # The primals carry the caller's tangents (forward-AD level 0, the only one).
        primals = [_without_tangent(a) for a in args[:n]]
        tangents = args[n:]

        def at(*varied):
            for i, v in zip(have, varied):
                primals[i] = v
            return tuple(branch(*primals))

        outputs, result = torch.func.jvp(at, tuple(primals[i] for i in have), tuple(tangents))[:2]
        return tuple(torch.zeros_like(o) if t is None else t for o, t in zip(outputs, result))

    return jvp


def _without_tangent(value):
    if not isinstance(value, torch.Tensor):
        return value
    return forward_ad.unpack_dual(value, level=0).primal


def _jvp_of(
    branch: Callable, n: int, have: Sequence[int], closed_over: Sequence[torch.Tensor] = ()
):
    """Compute forward mode through reverse mode, the "double vjp": ``J t = d/du <J^T u, t>``.

    Tracing forward-mode AD itself would nest inside a caller's forward-AD level, which
    autograd does not support. Two reverse passes need no level at all.
    """

    def jvp(*args):
        primals, wrt = _leaves(args[:n], have, closed_over)
        tangents = args[n:]
        outputs = _run_differentiably(branch, primals)
        varied = [j for j, o in enumerate(outputs) if o.requires_grad]
        result = [torch.zeros_like(o) for o in outputs]
        if not varied:
            return tuple(result)
        dummies = [torch.zeros_like(outputs[j], requires_grad=True) for j in varied]
        vjps = torch.autograd.grad(
            [outputs[j] for j in varied],
            wrt,
            dummies,
            allow_unused=True,
            create_graph=True,
        )
        pairs = [(g, t) for g, t in zip(vjps, tangents) if g is not None and g.requires_grad]
        if pairs:
            # Use create_graph, as in _vjp_of. The ops run with grad on, so a
            # derivative of this graph (forward over forward) goes through them.
            jt = torch.autograd.grad(
                [g for g, _ in pairs],
                dummies,
                [t for _, t in pairs],
                allow_unused=True,
                create_graph=True,
            )
            for j, value in zip(varied, jt):
                if value is not None:
                    result[j] = value
        return tuple(result)

    return jvp


def _leaves(primals, which: Sequence[int], closed_over: Sequence[torch.Tensor]):
    """Return the primals, with those in ``which`` made leaves that require grad.

    Also return what to differentiate with respect to. That is each such leaf, or for a
    position past the primals, the closure the branch reads itself."""
    primals = list(primals)
    n = len(primals)
    for i in which:
        # A primal that requires grad is a leaf made here, or a value of the caller's
        # trace that is differentiated as it is. A detach would cut off a higher
        # derivative.
        if i < n and not primals[i].requires_grad:
            primals[i] = primals[i].detach().requires_grad_(True)
    return primals, [primals[i] if i < n else closed_over[i - n] for i in which]


def _from_user_branches(ctx, selector, primals, given, derivative_of):
    """Trace the derivative conditional from the user's branches (``ctx.from_user_branches``).

    Return None if derivatives come from graphs instead. That happens without a
    ``FromUserBranches`` or without a make_fx session to trace in.
    ``derivative_of(branch, n, closures)`` is ``_vjp_of`` or ``_jvp_of``."""
    tracer = _compat.active_fx_tracer()
    if ctx.from_user_branches is None or tracer is None:
        return None
    user = ctx.from_user_branches
    n = len(primals) - len(user.closures)
    fns = [derivative_of(b, n, user.closures) for b in user.branches]
    return _retraced(ctx.kind, tracer, selector, fns, (*primals[:n], *given))


def _retraced(kind: ConditionalKind, tracer, selector, fns, args):
    """Trace a conditional over derivative functions of the user's branches, and call it.

    The trace happens in the current session. The call passes ``args`` and the
    closures the functions read. The conditional's own derivatives come from those
    functions too, as autograd differentiates the user's backward code when it
    differentiates twice.
    """
    # Under a torch.func transform (jvp), the derivative is traced with its levels set
    # aside: tracing it calls requires_grad_, which a level refuses. The traced
    # conditional is then called on the level's tensors.
    aside = (
        _compat.transform_levels_set_aside()
        if _compat.torch_func_level_active()
        else contextlib.nullcontext()
    )
    with torch.enable_grad(), aside:
        traced = closures.trace_in_session(tracer, fns, args, kind.labels(len(fns)))
    for gm in traced.graphs:
        _drop_autograd_detaches(gm)
        draws.refuse_redraws(gm)
    operands = traced.operands
    if torch.is_grad_enabled() and any(_requires_grad(t) for t in operands):
        derivative = FromUserBranches(tuple(fns), operands[len(args) :])
        return DifferentiableConditional.apply(
            kind, selector, tuple(traced.branches), derivative, *operands
        )
    return kind.op(selector, *traced.branches, operands)


def _derivative_graph(fn, args) -> torch.fx.GraphModule:
    gm = materialize_graph(fn, args)
    _drop_autograd_detaches(gm)
    draws.refuse_redraws(gm)
    return gm


def _recordable(kind: ConditionalKind, graphs, built_in) -> list:
    """Return the derivative graphs to hand to the operator.

    Graphs built as subgraphs of the make_fx session now tracing (``built_in``) go as
    ``PretracedBranch``s, recorded without another trace. Each is a renamed copy, so
    every node has its own module. Other graphs go as they are, for the proxy rule to
    trace.
    """
    tracer = _compat.active_fx_tracer()
    if tracer is None or built_in is not tracer:
        return list(graphs)
    copies = [renamed_copy(gm) for gm in graphs]
    n_operands = len(copies[0].graph.find_nodes(op="placeholder"))
    return pretraced_branches(
        copies, kind.labels(len(copies)), n_operands, tracer, functional=False
    )


# A branch's own ``detach`` is a stop-gradient and stays. Autograd adds ``detach``
# nodes of its own when it saves and unpacks outputs for backward (make_fx sees the
# shallow copies). Left in, they would cut the derivative graph off from its inputs,
# and every higher derivative through them would be zero.
_STOP_GRADIENT = "torchcond_stop_gradient"
_DETACH = torch.ops.aten.detach.default
_COPY = torch.ops.aten.copy.default


class _DifferentiableReplay(torch.fx.Interpreter):
    """Runs a graph to differentiate it.

    Nodes traced with grad off run with grad off. The branch's own detaches are marked
    as stop-gradients in the new trace."""

    def run_node(self, n):
        if n.meta.get(OWN_BACKWARD):
            _refuse_own_backward(n, self.fetch_args_kwargs_from_env(n), self.module)
        if n.meta.get(GRAD_DISABLED):
            with torch.no_grad():
                out = super().run_node(n)
        elif n.op == "call_function" and n.target is _COPY:
            # This is functionalization's form of ``dst.copy_(src)``, a write into a
            # buffer. Autograd has no derivative for it, but has one for the in-place copy.
            dst, src = self.fetch_args_kwargs_from_env(n)[0][:2]
            out = dst.clone().copy_(src)
        else:
            out = super().run_node(n)
        if n.op == "call_function" and n.target is _DETACH:
            node = _compat.traced_node(out)
            if node is not None:
                node.meta[_STOP_GRADIENT] = True
        return out


def _refuse_own_backward(node, args_kwargs, graph) -> None:
    """Refuse a custom Function's forward on inputs that need a gradient.

    Its backward is not in the graph, and differentiating the forward ops does not
    give it. Derivatives usually come from the user's branch, where the backward runs.
    They come from the graph in two cases, and the message names the one that holds:

    * the branch draws random numbers, and derivatives replay the draws in its graph;
    * the derivative is taken outside the trace that recorded the forward.
    """
    if not any(_requires_grad(v) for v in pytree.tree_leaves(args_kwargs)):
        return
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    where = f" at {trace[-2].strip()}" if len(trace) >= 2 else ""
    what = (
        f"cannot differentiate a traced branch through {node.target}{where}: it ran "
        "inside a custom torch.autograd.Function's forward (or inference_mode), whose "
        "backward is not in the branch's graph, and this derivative is taken from that graph"
    )
    if draws.replays_draws(graph):
        raise UnsupportedCondError(
            f"{what}: the branch also draws random numbers, which the derivative replays "
            "from it. Draw them outside the conditional and pass them in, or differentiate "
            "eagerly or under torch.compile, which run the Function's own backward."
        )
    raise UnsupportedCondError(
        f"{what}: the derivative is taken outside the make_fx trace that recorded the "
        "forward. Take it inside that trace (torch.autograd.grad in the traced function), "
        "or differentiate eagerly or under torch.compile, which run the Function's own "
        "backward."
    )


def _run_differentiably(branch, args):
    if isinstance(branch, torch.fx.GraphModule):
        return tuple(_DifferentiableReplay(branch).run(*args))
    with _MarkingStopGradients():
        return tuple(branch(*args))


class _MarkingStopGradients(torch.overrides.TorchFunctionMode):
    """Marks the user's own ``detach`` calls as stop-gradients in the trace.

    Autograd's own detaches run in C++ and are not torch functions."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _DETACH_CALLS and isinstance(out, torch.Tensor):
            inner = _compat.functional_inner(out)
            node = _compat.traced_node(out if inner is None else inner)
            if node is not None:
                node.meta[_STOP_GRADIENT] = True
        return out


_DETACH_CALLS = (torch.Tensor.detach, torch.detach)


def _drop_autograd_detaches(gm: torch.fx.GraphModule) -> None:
    """Drop autograd's detaches, and what the trace computed that nothing reads.

    The unread values include the vjp's forward outputs."""
    for node in list(gm.graph.find_nodes(op="call_function", target=_DETACH)):
        if not node.meta.get(_STOP_GRADIENT):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()


def _prune_unused_inputs(graphs: Sequence[torch.fx.GraphModule]) -> list[int]:
    """Drop the inputs that no graph reads, and return the kept input positions.

    A symbolic size stays while a value in some graph has it in its shape. Inductor
    compiles each graph on its own, and a graph binds its symbols from its inputs. So
    an input ``f32[4*s0, 4]`` needs ``s0`` passed too.
    """
    placeholders = [gm.graph.find_nodes(op="placeholder") for gm in graphs]
    read = {k for phs in placeholders for k, ph in enumerate(phs) if ph.users}
    shapes_use = set().union(
        *(
            symbols_of(node.meta.get("val"))
            for gm, phs in zip(graphs, placeholders)
            for node in gm.graph.nodes
            if node.op != "placeholder" or phs.index(node) in read
        )
    )
    used = [
        k
        for k, ph in enumerate(placeholders[0])
        if k in read or (is_symbolic_scalar(ph) and symbols_of(ph.meta.get("val")) & shapes_use)
    ]
    for gm, phs in zip(graphs, placeholders):
        for k, ph in enumerate(phs):
            if k not in used:
                gm.graph.erase_node(ph)
        gm.graph.lint()
        gm.recompile()
    return used


def _signature(args) -> tuple:
    """Return the metadata a traced derivative graph depends on. Values do not matter."""

    def one(a):
        if isinstance(a, torch.Tensor):
            return (a.dtype, a.device, tuple(map(str, a.shape)), tuple(map(str, a.stride())))
        return type(a).__name__

    return (id(_compat.fake_mode_of(args)), *map(one, args))


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cache(branches, key, build):
    """Build the derivative graphs of closure-free forward graphs once per key.

    The cache holds the first branch graph weakly. The entry holds the other graphs,
    so their ids in the key stay theirs while the entry lives. Returns what ``build``
    returned and the make_fx tracer whose subgraphs it built (None outside a session).
    An entry built in another session is built again.
    """
    tracer = _compat.active_fx_tracer() if _compat.in_make_fx_session() else None
    if not all(closure_free(b) for b in branches):
        return build(), tracer
    per_graph = _CACHE.setdefault(branches[0], {})
    full_key = (key, tuple(id(b) for b in branches[1:]))
    hit = per_graph.get(full_key)
    if hit is None or (tracer is not None and hit[2]() is not tracer):
        # Hold the tracer only weakly. It holds the forward graphs, which key the cache.
        hit = per_graph[full_key] = (build(), tuple(branches[1:]), _weak(tracer))
    return hit[0], hit[2]()


def _weak(value):
    return weakref.ref(value) if value is not None else lambda: None
