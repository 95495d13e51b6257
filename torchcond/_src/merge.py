"""Check that several branches' outputs agree, and merge them into one fake output.

``check_agreement`` is the one rule for whether branches' outputs can be one
conditional's. Every path uses it: tracing (below), running and selecting every
branch (strategies.py, which also needs equal shapes), and dynamo's speculation.

Where the taken branch is unknown (fake tensors, meta tensors, symbolic predicates),
every branch runs. Their outputs must then agree on everything but sizes. Sizes that
differ become fresh unbacked SymInts whose range covers every branch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _C, _compat
from ..errors import BranchMismatchError
from .pytrees import check_same_structure

_dynamo_compiling = torch.compiler.is_dynamo_compiling
_MATCHING_ATTRIBUTES = ("dtype", "device", "layout", "ndim", "is_quantized", "is_sparse")


def merge_branch_outputs(
    branch_outputs: Sequence[tuple[torch.Tensor, ...]],
    labels: Sequence[str],
    shape_env=None,
    outside: frozenset = frozenset(),
) -> tuple[torch.Tensor, ...]:
    """Return fresh empty tensors that describe every branch's outputs at once.
    ``outside`` holds the data-dependent size symbols bound around the conditional."""
    check_agreement(branch_outputs, labels)
    return tuple(
        _merge_leaf(j, leaves, labels, shape_env, outside)
        for j, leaves in enumerate(zip(*branch_outputs))
    )


# Where every branch runs and a select picks each element, the shapes must agree too.
_SELECTED = (
    "every branch runs and each element is selected on the device (strategy='select', "
    "vmap with a per-example selector, or compiled inside jvp of a derivative), so "
)


def check_agreement(
    branch_outputs: Sequence[Sequence[torch.Tensor]],
    labels: Sequence[str],
    *,
    specs: Sequence | None = None,
    selected: bool = False,
) -> None:
    """Raise ``BranchMismatchError`` unless the branches' flat outputs can be one
    conditional's. They need the same pytree structure (``specs``, one per branch, when
    known) and count. Each output needs the same dtype, device, layout and rank. With
    ``selected`` (every branch runs and a select picks), the shapes must match too."""
    if specs is not None:
        check_same_structure(labels, specs)
    if not _dynamo_compiling() and type(branch_outputs) is list:
        if _C.plainly_agree(branch_outputs, selected):  # the common case, in C
            return
    counts = {len(outs) for outs in branch_outputs}
    if len(counts) != 1:
        found = ", ".join(f"{lab} returns {len(o)}" for lab, o in zip(labels, branch_outputs))
        raise BranchMismatchError(f"branches must return the same number of tensors: {found}")
    first_outs = branch_outputs[0]
    for j, first in enumerate(first_outs):
        leaves = [outs[j] for outs in branch_outputs]
        why = _SELECTED if selected else ""
        for attr in _MATCHING_ATTRIBUTES:
            values = [getattr(t, attr) for t in leaves]
            if any(v != values[0] for v in values[1:]):
                raise _mismatch(j, "", attr, labels, values, why)
        if first.is_quantized or first.is_sparse:
            raise BranchMismatchError.at(
                "output",
                j,
                f"{{path}}: quantized and sparse outputs are not supported; found {first.layout}",
            )
        if selected and not all(_same_shape(first, t) for t in leaves[1:]):
            raise _mismatch(j, "", "shape", labels, [tuple(t.shape) for t in leaves], why)


def _same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes. Data-dependent sizes are assumed equal and asserted at run time."""
    return a.dim() == b.dim() and all(map(_compat.assume_same_size, a.shape, b.shape))


def _mismatch(j: int, where: str, what: str, labels, values, why: str = "") -> BranchMismatchError:
    found = ", ".join(f"{lab} gives {v}" for lab, v in zip(labels, values))
    return BranchMismatchError.at(
        "output", j, f"{{path}}{where}: {why}branches must agree on {what}; {found}"
    )


def _merge_leaf(j: int, leaves, labels, shape_env, outside) -> torch.Tensor:
    first = leaves[0]
    sizes, sizes_agree = _merge_sizes(j, leaves, labels, shape_env, outside)
    strides = _merge_strides(leaves, sizes, sizes_agree)
    return torch.empty_strided(sizes, strides, dtype=first.dtype, device=first.device)


def _merge_sizes(j: int, leaves, labels, shape_env, outside) -> tuple[list, bool]:
    merged = []
    agree = True
    for dim, per_branch in enumerate(zip(*(t.shape for t in leaves))):
        if all(_compat.same_size(per_branch[0], s, outside) for s in per_branch[1:]):
            merged.append(per_branch[0])
            continue
        if shape_env is None:
            raise _mismatch(
                j,
                f" dim {dim}",
                "sizes when tracing without symbolic shapes (use symbolic tracing or "
                "torch.export to let sizes differ)",
                labels,
                per_branch,
            )
        agree = False
        ranges = [_compat.sym_range(shape_env, s) for s in per_branch]
        lower = min(r[0] for r in ranges)
        upper = max(r[1] for r in ranges)
        merged.append(_compat.new_unbacked_size(shape_env, lower, upper))
    return merged, agree


def _merge_strides(leaves, sizes, sizes_agree: bool) -> list:
    """Return the shared strides if every branch has them, else contiguous ones.
    When branches disagree, tracing makes each branch return a contiguous tensor
    (subgraph.align_output_layouts), so the promise holds at run time too."""
    first = leaves[0]
    if sizes_agree and all(_same_strides(t, first) for t in leaves[1:]):
        return list(first.stride())
    return _contiguous_strides(sizes)


def same_layout(tensors) -> bool:
    """Whether all ``tensors`` have the same sizes and strides, statically."""
    first = tensors[0]
    return all(
        len(t.shape) == len(first.shape)
        and all(_compat.same_size(a, b) for a, b in zip(t.shape, first.shape))
        and _same_strides(t, first)
        for t in tensors[1:]
    )


def _same_strides(a, b) -> bool:
    return all(_compat.same_size(x, y) for x, y in zip(a.stride(), b.stride()))


def _contiguous_strides(sizes) -> list:
    strides = []
    running = 1
    for size in reversed(sizes):
        strides.append(running)
        running = running * size
    return list(reversed(strides))
