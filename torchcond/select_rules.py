"""The fused select operators' rules, registered with ``torch.library``.

Fake (shape) functions, autograd (gradient to the selected side, zero elsewhere) and
vmap rules for ``torchcond::select`` and ``torchcond::select_n``, plus the new-style
``autograd.Function``s that ``fused_select`` uses under ``torch.func`` transforms.
A build without the kernels falls back to the ``torch.where`` references here.
"""

from __future__ import annotations

import torch

from . import _compat
from .errors import CondArgumentError
from .forms import switch_branch_of

_OPS = torch.ops.torchcond
# The extension always defines both (ABI 2); a stale build falls back to torch.where.
_HAVE_KERNELS = hasattr(_OPS, "select") and hasattr(_OPS, "select_n")


# ``register_autograd`` gives a C++-defined op an old-style autograd.Function, which
# functorch's grad/jvp transforms refuse, and it has no forward-mode formula. When an
# input is wrapped by a torch.func transform or carries a forward-mode tangent, the
# public functions go through the autograd.Functions below instead: same op, same
# backward, plus a jvp, and a vmap rule generated from the op's own.


def _needs_function(sel, values) -> bool:
    # dynamo records the operator itself (with its registered autograd and vmap rules)
    # and cannot trace functorch's wrapper queries
    if _compat.is_dynamo_compiling() or not _compat.transforms_active():
        return False
    wrapped = _compat.is_functorch_wrapped
    if wrapped(sel) or any(wrapped(v) for v in values):
        return True
    has = _compat.has_tangent  # returns at once when no forward-AD level is active
    return has(sel) or any(has(v) for v in values)


def _select_differentiable(pred, true_values, false_values) -> list[torch.Tensor]:
    if not true_values:
        return []
    if _needs_function(pred, (*true_values, *false_values)):
        return list(_SelectFunction.apply(pred, len(true_values), *true_values, *false_values))
    return _OPS.select(pred, true_values, false_values)


def _select_n_differentiable(index, flat, num_branches) -> list[torch.Tensor]:
    if not flat:
        return []
    if _needs_function(index, flat):
        return list(_SelectNFunction.apply(index, num_branches, *flat))
    return _OPS.select_n(index, flat, num_branches)


def _meta(values):
    """What a zero tangent needs (shape, dtype, device), without keeping the tensors alive."""
    return [(v.shape, v.dtype, v.device) for v in values]


def _tangent_or_zero(tangent, meta):
    if tangent is not None:
        return tangent
    shape, dtype, device = meta
    return torch.zeros((), dtype=dtype, device=device).expand(shape)


class _SelectorFunction(torch.autograd.Function):
    """``op(selector, count, *values)``: what select and select_n save is the same."""

    generate_vmap_rule = True

    @staticmethod
    def setup_context(ctx, inputs, output):
        selector, count, *values = inputs
        ctx.save_for_backward(selector)
        ctx.save_for_forward(selector)
        ctx.count = count
        ctx.meta = _meta(values)  # for zero tangents (jvp)
        ctx.set_materialize_grads(False)

    @staticmethod
    def _zero_filled(ctx, tangents):
        return [_tangent_or_zero(t, m) for t, m in zip(tangents, ctx.meta)]


class _SelectFunction(_SelectorFunction):
    """``count`` is the number of true values."""

    @staticmethod
    def forward(pred, n, *values):
        return tuple(_OPS.select(pred, list(values[:n]), list(values[n:])))

    @staticmethod
    def backward(ctx, *grads):
        (pred,) = ctx.saved_tensors
        n = ctx.count
        need = ctx.needs_input_grad[2:]
        grad_true, grad_false = _select_grads(
            pred, grads, need[:n], need[n:], _select_differentiable
        )
        return (None, None, *grad_true, *grad_false)

    @staticmethod
    def jvp(ctx, pred_tangent, n_tangent, *tangents):
        (pred,) = ctx.saved_tensors
        n = ctx.count
        tangents = _SelectorFunction._zero_filled(ctx, tangents)
        return tuple(_select_differentiable(pred, tangents[:n], tangents[n:]))


class _SelectNFunction(_SelectorFunction):
    """``count`` is the number of branches."""

    @staticmethod
    def forward(index, num_branches, *flat):
        return tuple(_OPS.select_n(index, list(flat), num_branches))

    @staticmethod
    def backward(ctx, *grads):
        (index,) = ctx.saved_tensors
        need = ctx.needs_input_grad[2:]
        result = _select_n_grads(index, grads, ctx.count, need, _select_n_differentiable)
        return (None, None, *result)

    @staticmethod
    def jvp(ctx, index_tangent, nb_tangent, *tangents):
        (index,) = ctx.saved_tensors
        tangents = _SelectorFunction._zero_filled(ctx, tangents)
        return tuple(_select_n_differentiable(index, tangents, ctx.count))


# --- reference path (torch.where): only for a stale extension without the ops --------


def _expand_to(sel: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return sel.reshape(tuple(sel.shape) + (1,) * (value.dim() - sel.dim())).to(value.device)


def _select_reference(pred, true_values, false_values):
    return [
        torch.where(_expand_to(pred, t), t, f).contiguous()
        for t, f in zip(true_values, false_values)
    ]


def _select_n_reference(index, cases):
    index = switch_branch_of(index, len(cases))
    outs = []
    for i in range(len(cases[0])):
        out = cases[-1][i]
        for k in range(len(cases) - 2, -1, -1):
            out = torch.where(_expand_to(index == k, out), cases[k][i], out)
        outs.append(
            out.contiguous() if len(cases) > 1 else out.clone(memory_format=torch.contiguous_format)
        )
    return outs


# --- operator registrations ------------------------------------------------------------


def _zeros(like: torch.Tensor) -> torch.Tensor:
    """A zero shaped like ``like`` that costs one element (stride 0)."""
    return torch.zeros((), dtype=like.dtype, device=like.device).expand(like.shape)


def _fake_check_devices(op, sel, sel_name, values, label) -> None:
    """The kernels' device rules, for fake/meta calls (which mixed devices reach)."""
    if not values:
        return
    device = values[0].device
    for j, v in enumerate(values):
        if v.device != device:
            raise CondArgumentError(
                f"{op}: {label(j)}: expected a tensor on {device} (the device of {label(0)}; "
                f"every value must be on one device), found one on {v.device}"
            )
    if sel.device != device and (sel.dim() or sel.device.type != "cpu"):
        raise CondArgumentError(
            f"{op}: {sel_name}: expected a tensor on {device} (the device of {label(0)}) or "
            f"a 0-d CPU tensor, found one of shape {tuple(sel.shape)} on {sel.device}"
        )


def _select_fake(pred, true_values, false_values):
    op = "torchcond::select"
    if len(true_values) != len(false_values):
        raise CondArgumentError(
            f"{op}: true_values has {len(true_values)} tensors, false_values has "
            f"{len(false_values)}; they must pair up"
        )
    n = len(true_values)
    values = [*true_values, *false_values]
    label = lambda j: f"true_values[{j}]" if j < n else f"false_values[{j - n}]"  # noqa: E731
    _fake_check_devices(op, pred, "pred", values, label)
    return [t.new_empty(t.shape) for t in true_values]


def _select_n_fake(index, cases, num_branches):
    op = "torchcond::select_n"
    if num_branches < 1:
        raise CondArgumentError(f"{op}: num_branches: expected at least 1, found {num_branches}")
    if len(cases) % num_branches:
        raise CondArgumentError(
            f"{op}: cases: expected a multiple of num_branches ({num_branches}) tensors, "
            f"found {len(cases)} tensors"
        )
    _fake_check_devices(op, index, "index", cases, lambda j: f"cases[{j}]")
    n_out = len(cases) // num_branches
    return [c.new_empty(c.shape) for c in cases[:n_out]]


def _select_setup_context(ctx, inputs, output):
    pred = inputs[0]
    ctx.save_for_backward(pred)
    ctx.set_materialize_grads(False)  # outputs without a gradient arrive as None


def _select_grads(pred, grads, need_true, need_false, select_fn):
    """Gradients of select's values: the cotangent on the selected side, zero elsewhere."""
    n = len(grads)
    to_true = [i for i in range(n) if grads[i] is not None and need_true[i]]
    to_false = [i for i in range(n) if grads[i] is not None and need_false[i]]
    grad_true: list = [None] * n
    grad_false: list = [None] * n
    if to_true or to_false:
        zeros = {i: _zeros(grads[i]) for i in (*to_true, *to_false)}
        # One select for both sides: where pred holds the true side gets the cotangent
        # and the false side zero, and the other way around elsewhere.
        outs = select_fn(
            pred,
            [grads[i] for i in to_true] + [zeros[i] for i in to_false],
            [zeros[i] for i in to_true] + [grads[i] for i in to_false],
        )
        for k, i in enumerate(to_true):
            grad_true[i] = outs[k]
        for k, i in enumerate(to_false):
            grad_false[i] = outs[len(to_true) + k]
    return grad_true, grad_false


def _select_n_grads(index, grads, nb, need, select_n_fn):
    """Gradients of select_n's cases (flat, branch-major)."""
    n = len(grads)
    pairs = [
        (k, i) for k in range(nb) for i in range(n) if grads[i] is not None and need[k * n + i]
    ]
    result: list = [None] * (nb * n)
    if pairs:
        zeros = {i: _zeros(grads[i]) for _, i in pairs}
        # Output (k, i) is branch k's gradient for output i: the cotangent where the
        # index picks k, zero elsewhere. Branch j of that select is the cotangent
        # when j == k, else the zero.
        flat = [grads[i] if j == k else zeros[i] for j in range(nb) for k, i in pairs]
        outs = select_n_fn(index, flat, nb)
        for m, (k, i) in enumerate(pairs):
            result[k * n + i] = outs[m]
    return result


def _select_backward(ctx, grads):
    (pred,) = ctx.saved_tensors
    _, need_true, need_false = ctx.needs_input_grad
    # Through _select_differentiable, not the op: forward-over-reverse gives the
    # cotangents tangents, and only its autograd.Function has a jvp.
    grad_true, grad_false = _select_grads(
        pred, grads, need_true, need_false, _select_differentiable
    )
    return None, grad_true, grad_false


def _select_n_setup_context(ctx, inputs, output):
    index, _, num_branches = inputs
    ctx.save_for_backward(index)
    ctx.num_branches = num_branches
    ctx.set_materialize_grads(False)


def _select_n_backward(ctx, grads):
    (index,) = ctx.saved_tensors
    _, need, _ = ctx.needs_input_grad
    return (
        None,
        _select_n_grads(index, grads, ctx.num_branches, need, _select_n_differentiable),
        None,
    )


def _to_front(value: torch.Tensor, bdim, batch_size: int) -> torch.Tensor:
    if bdim is None:
        return value.expand(batch_size, *value.shape)
    return value.movedim(bdim, 0)


def _vmap_calls(sel, sel_bdim, groups, batch_size):
    """Op calls that compute a vmapped select: ``[(selector, outputs, values, batched)]``.

    ``groups``: per output, the ``(value, bdim)`` of each branch. Each call gives the
    selector, which outputs it computes, their per-branch values in a layout the op
    accepts, and whether those outputs carry the batch dim (at 0).

    * A batched selector goes to the front, and every value gets a front batch dim
      (expanded, without a copy, when unbatched).
    * An unbatched 0-d selector applies to every example: one call; outputs whose
      values are all unbatched stay unbatched.
    * An unbatched shaped selector is expanded with a front batch dim for the outputs
      with a batched value (so its shape stays a prefix of theirs) and used as is for
      the others: up to two calls.
    """
    if sel_bdim is not None:
        sel = sel.movedim(sel_bdim, 0)
        values = [[_to_front(v, d, batch_size) for v, d in g] for g in groups]
        return [(sel, list(range(len(groups))), values, True)]
    is_batched = [any(d is not None for _, d in g) for g in groups]
    batched = [i for i, b in enumerate(is_batched) if b]
    plain = [i for i, b in enumerate(is_batched) if not b]
    fronted = {i: [_to_front(v, d, batch_size) for v, d in groups[i]] for i in batched}
    if sel.dim() == 0:
        values = [
            fronted[i] if is_batched[i] else [v for v, _ in groups[i]] for i in range(len(groups))
        ]
        return [(sel, list(range(len(groups))), values, is_batched)]
    calls = []
    if batched:
        sel_b = sel.expand(batch_size, *sel.shape)
        calls.append((sel_b, batched, [fronted[i] for i in batched], True))
    if plain:
        calls.append((sel, plain, [[v for v, _ in groups[i]] for i in plain], False))
    return calls


def _run_vmap_calls(op_call, sel, sel_bdim, groups, batch_size):
    n = len(groups)
    outputs: list = [None] * n
    out_dims: list = [None] * n
    for s, which, values, batched in _vmap_calls(sel, sel_bdim, groups, batch_size):
        outs = op_call(s, values)
        for m, (i, out) in enumerate(zip(which, outs)):
            outputs[i] = out
            flag = batched if isinstance(batched, bool) else batched[m]
            out_dims[i] = 0 if flag else None
    return outputs, out_dims


def _select_vmap(info, in_dims, pred, true_values, false_values):
    pred_bdim, true_bdims, false_bdims = in_dims
    groups = [
        [(t, dt), (f, df)]
        for t, f, dt, df in zip(true_values, false_values, true_bdims, false_bdims)
    ]

    def call(sel, values):
        return _OPS.select(sel, [v[0] for v in values], [v[1] for v in values])

    return _run_vmap_calls(call, pred, pred_bdim, groups, info.batch_size)


def _select_n_vmap(info, in_dims, index, cases, num_branches):
    index_bdim, case_bdims, _ = in_dims
    n = len(cases) // num_branches
    groups = [
        [(cases[k * n + i], case_bdims[k * n + i]) for k in range(num_branches)] for i in range(n)
    ]

    def call(sel, values):
        flat = [v[k] for k in range(num_branches) for v in values]
        return _OPS.select_n(sel, flat, num_branches)

    return _run_vmap_calls(call, index, index_bdim, groups, info.batch_size)


if _HAVE_KERNELS:
    torch.library.register_fake("torchcond::select")(_select_fake)
    torch.library.register_fake("torchcond::select_n")(_select_n_fake)
    torch.library.register_autograd(
        "torchcond::select", _select_backward, setup_context=_select_setup_context
    )
    torch.library.register_autograd(
        "torchcond::select_n", _select_n_backward, setup_context=_select_n_setup_context
    )
    torch.library.register_vmap("torchcond::select", _select_vmap)
    torch.library.register_vmap("torchcond::select_n", _select_n_vmap)
