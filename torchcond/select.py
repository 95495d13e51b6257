"""Fused branch select: pick every output of a conditional on the device.

``select(pred, true_values, false_values)`` returns, for each pair, the true value
where ``pred`` holds and the false value elsewhere; ``select_n(index, cases)`` is the
N-way form (``cases[k]`` is branch ``k``'s outputs; the index is clamped like
``switch``). ``pred``/``index`` is either a 0-d device tensor (no host sync) or has a
shape that is a prefix of every value's shape (one choice per leading element, as
under vmap).

REFERENCE IMPLEMENTATION (torch.where): the fused C++/CUDA kernels replace the body
of ``_select_impl``/``_select_n_impl``; the public signatures and checks stay.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .errors import CondArgumentError


def select(pred: torch.Tensor, true_values: Sequence[torch.Tensor], false_values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    true_values, false_values = list(true_values), list(false_values)
    _check_selector(pred, "pred", integer=False)
    if len(true_values) != len(false_values):
        raise CondArgumentError(
            f"select: true_values has {len(true_values)} tensors, false_values has "
            f"{len(false_values)}; they must pair up"
        )
    _check_cases(pred, "pred", [true_values, false_values], ["true_values", "false_values"])
    return _select_impl(pred, true_values, false_values)


def select_n(index: torch.Tensor, cases: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    cases = [list(c) for c in cases]
    if not cases:
        raise CondArgumentError("select_n: cases is empty; give at least one branch's outputs")
    _check_selector(index, "index", integer=True)
    for k, c in enumerate(cases[1:], 1):
        if len(c) != len(cases[0]):
            raise CondArgumentError(
                f"select_n: cases[{k}] has {len(c)} tensors, cases[0] has {len(cases[0])}"
            )
    _check_cases(index, "index", cases, [f"cases[{k}]" for k in range(len(cases))])
    return _select_n_impl(index, cases)


def _check_selector(sel, name: str, integer: bool) -> None:
    if not isinstance(sel, torch.Tensor):
        raise CondArgumentError(f"{name}: expected a tensor, found {type(sel).__name__}")
    ok = (sel.dtype is not torch.bool and not sel.dtype.is_floating_point and not sel.dtype.is_complex) if integer else sel.dtype is torch.bool
    if not ok:
        want = "an integer dtype" if integer else "dtype torch.bool"
        raise CondArgumentError(f"{name}: expected {want}, found {sel.dtype}")


def _check_cases(sel, name, cases, labels) -> None:
    first = cases[0]
    for label, values in zip(labels, cases):
        for i, (v, ref) in enumerate(zip(values, first)):
            if not isinstance(v, torch.Tensor):
                raise CondArgumentError(f"{label}[{i}]: expected a tensor, found {type(v).__name__}")
            if v.shape != ref.shape or v.dtype != ref.dtype or v.device != ref.device:
                raise CondArgumentError(
                    f"{label}[{i}]: expected shape {tuple(ref.shape)}, {ref.dtype} on {ref.device} "
                    f"(as {labels[0]}[{i}]), found shape {tuple(v.shape)}, {v.dtype} on {v.device}"
                )
            if sel.dim() and tuple(v.shape[: sel.dim()]) != tuple(sel.shape):
                raise CondArgumentError(
                    f"{name}: its shape {tuple(sel.shape)} must be a prefix of every value's "
                    f"shape; {label}[{i}] has shape {tuple(v.shape)}"
                )


def _expand_to(sel: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return sel.reshape(tuple(sel.shape) + (1,) * (value.dim() - sel.dim())).to(value.device)


def _select_impl(pred, true_values, false_values):
    return [torch.where(_expand_to(pred, t), t, f) for t, f in zip(true_values, false_values)]


def _select_n_impl(index, cases):
    index = index.clamp(0, len(cases) - 1)
    outs = []
    for i in range(len(cases[0])):
        out = cases[-1][i]
        for k in range(len(cases) - 2, -1, -1):
            out = torch.where(_expand_to(index == k, out), cases[k][i], out)
        outs.append(out)
    return outs
