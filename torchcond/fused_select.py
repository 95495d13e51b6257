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
module is their Python entry point (argument checks, eager fast path);
``select_rules.py`` registers their rules with ``torch.library``:

* ``register_fake``: fresh contiguous outputs shaped like the values (tracing, export,
  ``torch.compile``, meta tensors);
* ``register_autograd``: the gradient goes to the selected side and is zero on the
  other (computed with the select op itself against a stride-0 zero, so no ``NaN``
  or ``Inf`` from the unselected side's cotangent can leak); none for the selector;
* ``register_vmap``: batch dims to the front; a batched selector expands unbatched
  values, batched values expand an unbatched (non-0-d) selector.

``register_autograd`` gives a C++-defined op an old-style ``autograd.Function`` that
``torch.func.grad``/``jvp`` refuse, with no forward-mode formula. So when an input is
wrapped by a ``torch.func`` transform or carries a forward-mode tangent, ``select``
and ``select_n`` call the same op through new-style ``autograd.Function``s (same
backward, plus a jvp: the select of the tangents; vmap rule generated from the op's).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import _compat
from .errors import CondArgumentError
from .select_rules import (
    _HAVE_KERNELS,
    _OPS,
    _select_differentiable,
    _select_n_differentiable,
    _select_n_reference,
    _select_reference,
)

__all__ = ["select", "select_n"]

if _HAVE_KERNELS:
    _SELECT = _OPS.select.default
    _SELECT_N = _OPS.select_n.default


# --- public functions ------------------------------------------------------------------
#
# Plain eager calls (no tracing, no torch.func transform, no forward AD) go straight to
# the operator, which checks its arguments in C++; the Python checks below run only
# when it raises, to turn the user's mistake into a CondArgumentError with the same
# message. While tracing (fake tensors do not check shapes) they run first.

# What the operator raises for bad arguments (TORCH_CHECK_VALUE/TYPE, the argument
# parser, NotImplementedError for a layout it has no kernel for) or an attribute a
# non-tensor lacks.
_OP_ERRORS = (RuntimeError, TypeError, ValueError, AttributeError, IndexError, NotImplementedError)


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
    if _HAVE_KERNELS and not _compat.tracing():
        try:
            return _select_eager(pred, true_values, false_values)
        except _OP_ERRORS:
            _check_select(
                pred, true_values, false_values
            )  # raises CondArgumentError if it is the arguments
            raise
    _check_select(pred, true_values, false_values)
    if not _HAVE_KERNELS:
        return _select_reference(pred, true_values, false_values)
    return _select_differentiable(pred, true_values, false_values)


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
    if _HAVE_KERNELS and cases and not _compat.tracing():
        flat = [v for c in cases for v in c]
        if all(len(c) == len(cases[0]) for c in cases):
            try:
                return _select_n_eager(index, flat, len(cases))
            except _OP_ERRORS:
                _check_select_n(index, cases)
                raise
    _check_select_n(index, cases)
    if not _HAVE_KERNELS:
        return _select_n_reference(index, cases)
    return _select_n_differentiable(index, [v for c in cases for v in c], len(cases))


def _select_eager(pred, true_values, false_values):
    if _compat.transforms_active():
        return _select_differentiable(pred, true_values, false_values)
    if torch.is_grad_enabled() and (
        any(v.requires_grad for v in true_values) or any(v.requires_grad for v in false_values)
    ):
        return _SELECT(pred, true_values, false_values)  # the operator's autograd rule
    with _compat.below_autograd():  # what that rule does when no input needs a gradient
        return _SELECT(pred, true_values, false_values)


def _select_n_eager(index, flat, num_branches):
    if _compat.transforms_active():
        return _select_n_differentiable(index, flat, num_branches)
    if torch.is_grad_enabled() and any(v.requires_grad for v in flat):
        return _SELECT_N(index, flat, num_branches)
    with _compat.below_autograd():
        return _SELECT_N(index, flat, num_branches)


# --- argument checks -------------------------------------------------------------------


_TENSORS = "a list or tuple of tensors (one per output)"
_ONE_OUTPUT = ". Pass [tensor] for one output"


def _as_list(values, fn: str, label: str, expected: str, lone_tensor_hint: str = "") -> list:
    """A sequence argument as a list. A lone tensor is refused: iterating it would
    select between its rows."""
    if isinstance(values, torch.Tensor):
        found = f"a tensor of shape {tuple(values.shape)}{lone_tensor_hint}"
    elif not isinstance(values, Sequence) or isinstance(values, str):
        found = type(values).__name__
    else:
        return list(values)
    raise CondArgumentError(f"{fn}: argument '{label}' must be {expected}; found {found}")


def _check_select(pred, true_values, false_values) -> None:
    _check_selector(pred, "pred", integer=False)
    if len(true_values) != len(false_values):
        raise CondArgumentError(
            f"select: true_values has {len(true_values)} tensors, false_values has "
            f"{len(false_values)}; they must pair up (one true and one false value per output)"
        )
    _check_cases(pred, "pred", [true_values, false_values], ["true_values", "false_values"])


def _check_select_n(index, cases) -> None:
    if not cases:
        raise CondArgumentError(
            "select_n: cases: expected at least one branch's outputs, found an empty sequence"
        )
    _check_selector(index, "index", integer=True)
    for k, c in enumerate(cases[1:], 1):
        if len(c) != len(cases[0]):
            raise CondArgumentError(
                f"select_n: cases[{k}] has {len(c)} tensors, cases[0] has {len(cases[0])}; "
                "every branch must give the same number of outputs"
            )
    _check_cases(index, "index", cases, [f"cases[{k}]" for k in range(len(cases))])


def _check_selector(sel, name: str, integer: bool) -> None:
    if not isinstance(sel, torch.Tensor):
        raise CondArgumentError(f"{name}: expected a tensor, found {type(sel).__name__}")
    _check_strided(sel, name)
    dtype = sel.dtype
    if integer:
        ok = dtype is not torch.bool and not dtype.is_floating_point and not dtype.is_complex
    else:
        ok = dtype is torch.bool
    if not ok:
        want = "an integer dtype" if integer else "dtype torch.bool"
        raise CondArgumentError(f"{name}: expected {want}, found {dtype}")


def _check_strided(t: torch.Tensor, label: str) -> None:
    if t.layout != torch.strided:
        raise CondArgumentError(
            f"{label}: expected a dense (torch.strided) tensor, found layout {t.layout}; "
            "convert it with .to_dense() first"
        )


def _check_cases(sel, name, cases, labels) -> None:
    first = cases[0]
    sel_shape = tuple(sel.shape)
    sel_dim = len(sel_shape)
    sel_device = sel.device
    for label, values in zip(labels, cases):
        for i, (v, ref) in enumerate(zip(values, first)):
            if not isinstance(v, torch.Tensor):
                raise CondArgumentError(
                    f"{label}[{i}]: expected a tensor, found {type(v).__name__}"
                )
            _check_strided(v, f"{label}[{i}]")
            if v.shape != ref.shape or v.dtype != ref.dtype or v.device != ref.device:
                raise CondArgumentError(
                    f"{label}[{i}]: expected shape {tuple(ref.shape)}, {ref.dtype} on {ref.device} "
                    f"(as {labels[0]}[{i}]), found shape {tuple(v.shape)}, {v.dtype} on {v.device}"
                )
    for i, ref in enumerate(first):
        if ref.device != first[0].device:
            raise CondArgumentError(
                f"{labels[0]}[{i}]: expected a tensor on {first[0].device} (the device of "
                f"{labels[0]}[0]; every value must be on one device), found one on {ref.device}"
            )
        if sel_dim and tuple(ref.shape[:sel_dim]) != sel_shape:
            raise CondArgumentError(
                f"{name}: expected a 0-d tensor or one whose shape is a prefix of every "
                f"value's shape; its shape {sel_shape} is not a prefix of {labels[0]}[{i}]'s "
                f"shape {tuple(ref.shape)}"
            )
        if sel_device != ref.device and (sel_dim or sel_device.type != "cpu"):
            raise CondArgumentError(
                f"{name}: expected a tensor on {ref.device} (the device of {labels[0]}[{i}]) "
                f"or a 0-d CPU tensor, found shape {sel_shape} on {sel_device}"
            )


# --- torch.func transforms and forward-mode AD ----------------------------------------
#
