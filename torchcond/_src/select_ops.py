"""Fused branch select: pick every output of a conditional on the device.

``select(pred, true_values, false_values)`` returns, for each pair, the true value
where ``pred`` holds and the false value elsewhere; ``select_n(index, cases)`` is the
N-way form (``cases[k]`` is branch ``k``'s outputs; the index is clamped like
``switch``). ``pred``/``index`` is either a 0-d tensor (on the values' device, read
there with no host sync; or on the CPU, read on the host for free) or has a shape
that is a prefix of every value's shape (one choice per leading element, as under
vmap).

Both are the C++/CUDA operators ``torch.ops.torchcond.select`` and
``torch.ops.torchcond.select_n`` (``csrc/``): one parallel loop (CPU) or one kernel
launch (CUDA) for all outputs, each element reading only the side it selects. This
module is everything Python knows about them, in the order of pytorch/extension-cpp's
``ops.py``:

* the public functions ``select`` and ``select_n``;
* ``register_fake``: fresh contiguous outputs shaped like the values (tracing, export,
  ``torch.compile``, meta tensors), after the kernels' own argument checks;
* the Autograd kernels: the gradient goes to the selected side and is zero on the
  other (computed with the select op itself against a stride-0 zero, so no ``NaN``
  or ``Inf`` from the unselected side's cotangent can leak); none for the selector;
  the tangent is the select of the tangents. They apply new-style
  ``autograd.Function``s (backward and jvp); inside a ``torch.func`` transform, where
  those cannot be applied, they compute the select with ``torch.where``;
* ``register_vmap``: batch dims to the front; a batched selector expands unbatched
  values, batched values expand an unbatched (non-0-d) selector;
* eagerly, when an input is wrapped by a ``torch.func`` transform or carries a
  forward-mode tangent, ``select`` and ``select_n`` apply those Functions before
  dispatch, so that the transforms see them (vmap rule generated from the op's) and
  the fused kernel runs.

The arguments are checked once, in C++ (``csrc/select_common.cpp``), by the kernels
and, through ``torchcond._C._check_select``/``_check_select_n``, by the fake kernels.
The public functions turn those errors into ``CondArgumentError``. Python checks only
what the operators cannot see: the list arguments' nesting and Python types, and
tensors of a layout no kernel is registered for.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _C, _compat
from ..errors import CondArgumentError

__all__ = ["select", "select_n"]

_OPS = torch.ops.torchcond
_SELECT = _OPS.select.default
_SELECT_N = _OPS.select_n.default


# --- public functions ------------------------------------------------------------------
#
# Plain eager calls (no tracing, no torch.func transform, no forward AD) go straight to
# the operator's kernel; the others through the dispatcher (and the rules below). The
# operator checks the arguments either way; what it raises for them becomes a
# CondArgumentError with the same message.


def select(
    pred: torch.Tensor, true_values: Sequence[torch.Tensor], false_values: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """``[where(pred, t, f) for t, f in zip(true_values, false_values)]``, fused.

    ``pred``: a bool tensor, 0-d or shaped like a prefix of every value's shape.
    Returns fresh contiguous tensors. Each element reads only the value it selects.

    One kernel launch covers every output. Gradients flow to the selected side only
    (zeros, never ``NaN``, on the other), and ``torch.vmap`` is supported.

    Args:
        pred: a ``torch.bool`` tensor on the values' device: 0-d (one choice for
            everything) or with a shape that is a prefix of every value's shape (one
            choice per leading index).
        true_values: the tensors to take where ``pred`` is true.
        false_values: as many tensors, each with the shape, dtype and device of the
            matching ``true_values`` entry, to take where ``pred`` is false.

    Returns:
        One new tensor per pair, ``torch.where(pred, t, f)`` with ``pred`` broadcast
        over the trailing dimensions.

    Raises:
        CondArgumentError: ``pred`` is not a bool tensor or its shape is not a prefix
            of the values' shapes, the two lists differ in length, or a pair differs
            in shape, dtype or device.

    Examples:
        >>> pred = torch.tensor([True, False, True])
        >>> a, b = torchcond.select(
        ...     pred, [torch.ones(3), torch.ones(3, 2)], [torch.zeros(3), -torch.ones(3, 2)]
        ... )
        >>> a
        tensor([1., 0., 1.])
        >>> b
        tensor([[ 1.,  1.],
                [-1., -1.],
                [ 1.,  1.]])
        >>> torchcond.select(torch.tensor(True), [torch.ones(2)], [torch.zeros(3)])
        Traceback (most recent call last):
        ...
        torchcond.errors.CondArgumentError: false_values[0]: expected shape (2,), ...
    """
    true_values = _as_list(true_values, "select", "true_values", _TENSORS, _ONE_OUTPUT)
    false_values = _as_list(false_values, "select", "false_values", _TENSORS, _ONE_OUTPUT)
    return select_lists(pred, true_values, false_values)


def select_lists(pred: torch.Tensor, true_values: list, false_values: list) -> list:
    """``select`` for two lists of tensors (torchcond's own calls)."""
    try:
        if _compat.tracing_active():
            return _select_differentiable(pred, true_values, false_values)
        if not (_compat.transforms_active() or torch.is_grad_enabled()):
            return _C.select_below_autograd(pred, true_values, false_values)  # the common case
        return _select_eager(pred, true_values, false_values)
    except _OP_ERRORS as error:
        _raise_argument_error(
            error, "pred", pred, ("true_values", true_values), ("false_values", false_values)
        )
        raise


def select_n(index: torch.Tensor, cases: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    """Output ``i`` is ``cases[clamp(index, 0, len(cases) - 1)][i]``, elementwise, fused.

    ``index``: an integer tensor, 0-d or shaped like a prefix of every value's shape.

    The N-way :func:`select`, behind ``switch(..., strategy="select")``: one kernel
    launch for every output, and each element reads only the case it selects.

    Args:
        index: an integer tensor on the values' device, 0-d or with a shape that is a
            prefix of every value's shape. Out-of-range entries are clamped, as in
            :func:`torchcond.switch`.
        cases: one list of tensors per branch; every list has the same length, and
            its ``i``-th tensors agree in shape, dtype and device.

    Returns:
        One new tensor per output position.

    Raises:
        CondArgumentError: ``index`` is not an integer tensor or its shape is not a
            prefix of the values' shapes, ``cases`` is empty, or the cases disagree in
            length, shape, dtype or device.

    Examples:
        >>> cases = [[torch.zeros(4)], [torch.ones(4)], [torch.full((4,), 2.0)]]
        >>> torchcond.select_n(torch.tensor([0, 2, 1, 5]), cases)  # 5 is clamped to 2
        [tensor([0., 2., 1., 2.])]
    """
    cases = _as_list(cases, "select_n", "cases", "a list with one list of tensors per branch")
    cases = [
        _as_list(c, "select_n", f"cases[{k}]", _TENSORS, _ONE_OUTPUT) for k, c in enumerate(cases)
    ]
    _check_nesting(cases)
    flat = [v for c in cases for v in c]
    try:
        if _compat.tracing_active():
            return _select_n_differentiable(index, flat, len(cases))
        return _select_n_eager(index, flat, len(cases))
    except _OP_ERRORS as error:
        _raise_argument_error(
            error, "index", index, *((f"cases[{k}]", c) for k, c in enumerate(cases))
        )
        raise


def _select_eager(pred, true_values, false_values):
    if _compat.transforms_active():
        return _select_differentiable(pred, true_values, false_values)
    if torch.is_grad_enabled() and (
        any(v.requires_grad for v in true_values) or any(v.requires_grad for v in false_values)
    ):
        return _SELECT(pred, true_values, false_values)  # the operator's autograd rule
    # What that rule does when no input needs a gradient.
    return _C.select_below_autograd(pred, true_values, false_values)


def _select_n_eager(index, flat, num_branches):
    if _compat.transforms_active():
        return _select_n_differentiable(index, flat, num_branches)
    if torch.is_grad_enabled() and any(v.requires_grad for v in flat):
        return _SELECT_N(index, flat, num_branches)
    return _C.select_n_below_autograd(index, flat, num_branches)


# --- what the operators cannot check ---------------------------------------------------


_TENSORS = "a list or tuple of tensors (one per output)"
_ONE_OUTPUT = ". Pass [tensor] for one output"


def _as_list(values, fn: str, label: str, expected: str, lone_tensor_hint: str = "") -> list:
    """A sequence argument as a list. A lone tensor is refused: iterating it would
    select between its rows."""
    kind = type(values)
    if kind is list or kind is tuple:  # the common case, without an abstract class check
        return values if kind is list else list(values)
    if isinstance(values, torch.Tensor):
        found = f"a tensor of shape {tuple(values.shape)}{lone_tensor_hint}"
    elif not isinstance(values, Sequence) or isinstance(values, str):
        found = type(values).__name__
    else:
        return list(values)
    raise CondArgumentError(f"{fn}: argument '{label}' must be {expected}; found {found}")


def _check_nesting(cases: list) -> None:
    """select_n's cases as the operator cannot see them: it gets one flat list."""
    if not cases:
        raise CondArgumentError(
            "select_n: cases: expected at least one branch's outputs, found an empty sequence"
        )
    for k, c in enumerate(cases[1:], 1):
        if len(c) != len(cases[0]):
            raise CondArgumentError(
                f"select_n: cases[{k}] has {len(c)} tensors, cases[0] has {len(cases[0])}; "
                "every branch must give the same number of outputs"
            )


# What the operator raises for bad arguments: its checks' ValueError and TypeError
# (TORCH_CHECK_VALUE/TYPE), the schema parser's TypeError or RuntimeError for a
# non-tensor, NotImplementedError for a layout it has no kernel for.
_OP_ERRORS = (RuntimeError, TypeError, ValueError, AttributeError, IndexError, NotImplementedError)
_OP_PREFIXES = ("torchcond::select: ", "torchcond::select_n: ")


def _raise_argument_error(error: Exception, selector_name: str, selector, *groups) -> None:
    """Raises a CondArgumentError when the arguments caused ``error``, the operator's.

    The operator's checks (C++) say what is wrong in the public functions' words:
    their message is kept, less the operator's name. Before those checks run, torch's
    schema parser refuses a non-tensor and its dispatcher a layout with no kernel,
    with messages about the operator's schema: those two are named here.
    ``groups``: ``(label, values)`` pairs.
    """
    message = str(error)
    if isinstance(error, (ValueError, TypeError)) and message.startswith(_OP_PREFIXES):
        raise CondArgumentError(message.split(": ", 1)[1]) from None
    labelled = [(selector_name, selector)]
    labelled += [(f"{label}[{i}]", v) for label, values in groups for i, v in enumerate(values)]
    for label, value in labelled:
        if not isinstance(value, torch.Tensor):
            raise CondArgumentError(
                f"{label}: expected a tensor, found {type(value).__name__}"
            ) from None
        if value.layout != torch.strided:
            raise CondArgumentError(
                f"{label}: expected a dense (torch.strided) tensor, found layout {value.layout}; "
                "convert it with .to_dense() first"
            ) from None


# --- fake kernels ----------------------------------------------------------------------
#
# Shapes for tracing, export, torch.compile and meta tensors. The kernels' argument
# checks run first, in C++ on the fake tensors' metadata (symbolic shapes guard), so a
# traced call raises what an eager one does.


@torch.library.register_fake("torchcond::select")
def _select_fake(pred, true_values, false_values):
    _C._check_select(pred, true_values, false_values)
    return [t.new_empty(t.shape) for t in true_values]


@torch.library.register_fake("torchcond::select_n")
def _select_n_fake(index, cases, num_branches):
    _C._check_select_n(index, cases, num_branches)
    return [c.new_empty(c.shape) for c in cases[: len(cases) // num_branches]]


# --- autograd --------------------------------------------------------------------------


def _zeros(like: torch.Tensor) -> torch.Tensor:
    """A zero shaped like ``like`` that costs one element (stride 0)."""
    return torch.zeros((), dtype=like.dtype, device=like.device).expand(like.shape)


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


# The operators' Autograd kernels. torch.library.register_autograd would give a
# C++-defined operator an old-style autograd.Function: torch.func.grad refuses it and
# forward-mode AD (torch.func.jvp included) passes through it with a zero tangent.
# Instead, where a derivative is needed:
#
# * outside torch.func transforms, the new-style Functions below (backward and jvp,
#   both one fused select);
# * inside one (a transform's interpreter has already unwrapped the inputs, and a
#   Function applied here has no kernel to run), torch.where: every transform and
#   backend differentiates it. Eager code under a transform does not get here: the
#   public functions apply the Functions before dispatch (``_needs_function``).
#   Compiled code does: dynamo records the operator itself.


@torch.library.impl("torchcond::select", "Autograd")
def _select_autograd(pred, true_values, false_values):
    if not _C._needs_derivative([*true_values, *false_values]):
        with _compat.below_autograd():
            return _SELECT(pred, true_values, false_values)
    if _compat.torch_func_level_active():
        return _select_where(pred, true_values, false_values)
    return list(_SelectFunction.apply(pred, len(true_values), *true_values, *false_values))


@torch.library.impl("torchcond::select_n", "Autograd")
def _select_n_autograd(index, cases, num_branches):
    if not _C._needs_derivative(cases):
        with _compat.below_autograd():
            return _SELECT_N(index, cases, num_branches)
    if _compat.torch_func_level_active():
        return _select_n_where(index, cases, num_branches)
    return list(_SelectNFunction.apply(index, num_branches, *cases))


def _spread(selector: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``selector`` broadcastable against ``value``: trailing dims of size 1, on its device."""
    if selector.device != value.device:  # a 0-d CPU selector beside values elsewhere
        selector = selector.to(value.device)
    return selector.reshape((*selector.shape, *([1] * (value.dim() - selector.dim()))))


def _select_where(pred, true_values, false_values) -> list[torch.Tensor]:
    """The select operator in differentiable aten operations (same checks, same values)."""
    _C._check_select(pred, true_values, false_values)
    return [
        torch.where(_spread(pred, t), t, f).contiguous() for t, f in zip(true_values, false_values)
    ]


def _select_n_where(index, cases, num_branches: int) -> list[torch.Tensor]:
    """select_n as a chain of torch.where: case k where the index is at most k (which
    clamps it), the last case elsewhere."""
    _C._check_select_n(index, cases, num_branches)
    n = len(cases) // num_branches
    if num_branches == 1:  # fresh tensors, as the operator's
        return [c.clone(memory_format=torch.contiguous_format) for c in cases]
    outputs = list(cases[(num_branches - 1) * n :])
    for k in reversed(range(num_branches - 1)):
        at_most_k = index <= k
        for i in range(n):
            outputs[i] = torch.where(_spread(at_most_k, outputs[i]), cases[k * n + i], outputs[i])
    return [o.contiguous() for o in outputs]


# --- vmap ------------------------------------------------------------------------------


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


torch.library.register_vmap("torchcond::select", _select_vmap)
torch.library.register_vmap("torchcond::select_n", _select_n_vmap)


# --- torch.func transforms and forward-mode AD -----------------------------------------
#
# The autograd.Functions the Autograd kernels apply. When an input is wrapped by a
# torch.func transform or carries a forward-mode tangent, the public functions apply
# them before dispatch, where the transforms see them: same op, same backward and jvp,
# and a vmap rule generated from the op's own.


def _needs_function(sel, values) -> bool:
    # dynamo records the operator itself (with its registered autograd and vmap rules)
    # and cannot trace functorch's wrapper queries
    if _compat.is_dynamo_compiling() or not _compat.transforms_active():
        return False
    # A vmap level alone needs no Function: the op's own vmap rule batches it.
    wrapped = _compat.is_differentiated_by_transform
    if wrapped(sel) or any(wrapped(v) for v in values):
        return True
    has = _compat.has_tangent  # returns at once when no forward-AD level is active
    return has(sel) or any(has(v) for v in values)


def _select_differentiable(pred, true_values, false_values) -> list[torch.Tensor]:
    if true_values and _needs_function(pred, (*true_values, *false_values)):
        return list(_SelectFunction.apply(pred, len(true_values), *true_values, *false_values))
    return _OPS.select(pred, true_values, false_values)


def _select_n_differentiable(index, flat, num_branches) -> list[torch.Tensor]:
    if flat and _needs_function(index, flat):
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
