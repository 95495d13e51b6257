"""Branches that run whether or not they are taken may not write outside themselves.

``strategy="select"`` and vmap with a per-example selector run every branch, then
pick each output element on the device. A branch's in-place write to an operand, a
closed-over tensor or a parameter would then happen even when the branch is not
taken, which a Python ``if`` never does. ``refusing_outside_writes`` runs a branch
under a dispatch mode that raises before any such write: writes to tensors the
branch itself created are allowed, as they are invisible outside it.

Under dynamo the branch is traced inline and no dispatch mode can be entered
without a graph break, so the guard is not entered there; instead the select path
has dynamo speculate the branches as the operator's subgraphs first, and dynamo
refuses a subgraph that writes to anything from outside it (api._select_path).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

import torch

from .. import _compat
from ..errors import BranchMutationError
from .subgraph import written_arguments


@functools.cache
def _effects(op) -> tuple[bool, bool]:
    """Whether ``op`` writes to an argument, and whether its outputs are all fresh."""
    schema = _compat.schema_of(op)
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    fresh = all(r.alias_info is None for r in schema.returns)
    return writes, fresh


def refusing_outside_writes(label: str, operands: Sequence):
    """A context in which ``label``'s branch runs; see the module docstring."""
    if _compat.is_dynamo_compiling():
        return contextlib.nullcontext()
    return _OutsideWriteGuard(label, operands)


class _OutsideWriteGuard(_compat.TorchDispatchMode):
    """Raise ``BranchMutationError`` before an op writes to a tensor from outside."""

    def __init__(self, label: str, operands: Sequence):
        super().__init__()
        self.label = label
        self.operands = operands
        self.created: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        writes, fresh = _effects(func)
        if writes:
            for value in written_arguments(func, args, kwargs):
                if isinstance(value, torch.Tensor) and _storage_id(value) not in self.created:
                    raise self._error(func, value)
        out = func(*args, **kwargs)
        if fresh:  # a view or an in-place result shares an input's storage
            for leaf in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(leaf, torch.Tensor):
                    self.created.add(_storage_id(leaf))
        return out

    def _error(self, func, value) -> BranchMutationError:
        target = _storage_id(value)
        written = [
            i
            for i, t in enumerate(self.operands)
            if isinstance(t, torch.Tensor) and _storage_id(t) == target
        ]
        what = (
            "its input {path}"
            if written
            else f"a tensor from outside it (shape {tuple(value.shape)})"
        )
        message = (
            f"{self.label} writes in place ({func}) to {what}, but every branch runs "
            "here, taken or not (strategy='select', or vmap with a per-example selector), "
            "so the write would happen either way. Return the new value instead "
            "(x + 1 rather than x.add_(1))"
        )
        if written:
            return BranchMutationError.at("operand", written[0], message)
        return BranchMutationError(message)


def _storage_id(t: torch.Tensor):
    # Under vmap the mode sees batched wrappers; the storage is the batch's.
    return _compat.storage_key(_compat.functorch_base(t))
