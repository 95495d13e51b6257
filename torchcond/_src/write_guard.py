"""Branches that run whether or not they are taken: their writes, undone and selected.

``strategy="select"`` and vmap with a per-example selector run every branch, then
pick each output element on the device. A write a branch makes must then land only
where the branch is taken, as a Python ``if`` would make it. ``recording_writes`` runs
one branch under a dispatch mode that, before the branch's first write to an
operand, saves the operand's value; after the branch, the operand's new value is
taken (``BranchWrites.finish``) and the old one put back, so the next branch sees
it. Both are tensor ops, so a trace of the select records them. The caller selects
each written operand's value like an output and writes the selection back. A write
to anything else from outside the branch (a tensor it closes over, a parameter) is
refused before it happens: it cannot be selected per example. Writes to tensors the
branch itself created are invisible outside it.

Under dynamo the branch is traced inline and no dispatch mode can be entered
without a graph break, so the mode is not entered there; instead the select path
has dynamo speculate the branches as the operator's subgraphs first, and refuse a
subgraph that writes to anything from outside it (api._select_path).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

import torch

from .. import _compat
from .._compat.dynamo import differentiating_transform_active
from ..errors import BranchMutationError
from .subgraph import written_arguments


@functools.cache
def _effects(op) -> tuple[bool, bool]:
    """Whether ``op`` writes to an argument, and whether its outputs are all fresh."""
    schema = _compat.schema_of(op)
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    fresh = all(r.alias_info is None for r in schema.returns)
    return writes, fresh


class BranchWrites:
    """What ``recording_writes`` saw one branch write: operand positions, and how to
    read their new values and put their old ones back."""

    def __init__(self):
        # position -> (the operand's own tensor below any functorch wrapper, its old value)
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # Storages of tensors read in place of ones from outside (strategies.py masks
        # closures): made in the branch, but a write to one is a write to the outside.
        self.outside: set = set()

    def stand_in(self, t: torch.Tensor) -> None:
        """``t`` is read in place of a tensor from outside the branch."""
        if not _compat.is_dynamo_compiling():  # dynamo records no writes (see above)
            self.outside.add(_storage_id(t))

    def finish(self, operands: Sequence, outputs: tuple) -> tuple[tuple, dict[int, torch.Tensor]]:
        """The branch's outputs, and the new values of the operands it wrote to (each a
        copy); the operands then hold their old values again. An output that shares
        memory with a written operand is copied first (``x.add_(1)`` returns ``x``)."""
        if not self.saved:
            return outputs, {}
        storages = {_compat.storage_key(base) for base, _ in self.saved.values()}
        outputs = tuple(
            o.clone() if isinstance(o, torch.Tensor) and _storage_id(o) in storages else o
            for o in outputs
        )
        values = {i: operands[i].clone() for i in sorted(self.saved)}
        with torch.no_grad():
            for base, old in self.saved.values():
                base.copy_(old)
        return outputs, values


def recording_writes(label: str, operands: Sequence, writes: BranchWrites):
    """A context in which ``label``'s branch runs; see the module docstring."""
    if _compat.is_dynamo_compiling():
        return contextlib.nullcontext()
    return _WriteRecorder(label, operands, writes)


class _WriteRecorder(_compat.TorchDispatchMode):
    """Save an operand's value before the branch first writes to it; raise
    ``BranchMutationError`` before a write to any other tensor from outside."""

    def __init__(self, label: str, operands: Sequence, writes: BranchWrites):
        super().__init__()
        self.label = label
        self.operands = operands
        self.writes = writes
        self.created: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        writes, fresh = _effects(func)
        if writes:
            for value in written_arguments(func, args, kwargs):
                if not isinstance(value, torch.Tensor):
                    continue
                storage = _storage_id(value)
                if storage not in self.created or storage in self.writes.outside:
                    self._before_write(func, value)
        out = func(*args, **kwargs)
        if fresh:  # a view or an in-place result shares an input's storage
            for leaf in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(leaf, torch.Tensor):
                    self.created.add(_storage_id(leaf))
        return out

    def _before_write(self, func, value) -> None:
        target = _storage_id(value)
        written = [
            i
            for i, t in enumerate(self.operands)
            if isinstance(t, torch.Tensor) and _storage_id(t) == target
        ]
        if len(written) == 1 and written[0] in self.writes.saved:
            return
        why = None
        if not written:
            why = (
                f"a tensor from outside it (shape {tuple(value.shape)}), whose value cannot "
                "be selected per branch: pass it as an operand"
            )
        elif len(written) > 1:
            why = "its input {path}, which shares memory with another operand: pass it once"
        elif needs_grad(self.operands[written[0]]):
            why = (
                "its input {path}, which needs a gradient: return the new value instead "
                "(x + 1 rather than x.add_(1))"
            )
        if why is not None:
            message = (
                f"{self.label} writes in place ({func}) to {why}. Every branch runs here, "
                "taken or not (strategy='select', or vmap with a per-example selector), "
                "and each written operand's value is selected like an output"
            )
            if written:
                raise BranchMutationError.at("operand", written[0], message)
            raise BranchMutationError(message)
        base = _compat.functorch_base(self.operands[written[0]])
        self.writes.saved[written[0]] = (base, base.clone())


def needs_grad(t: torch.Tensor) -> bool:
    """A floating tensor autograd or a torch.func transform differentiates."""
    if not (t.dtype.is_floating_point or t.dtype.is_complex):
        return False
    if _compat.is_dynamo_compiling():  # dynamo sees no functorch wrappers
        return (torch.is_grad_enabled() and t.requires_grad) or differentiating_transform_active()
    if _compat.is_differentiated_by_transform(t):
        return True
    # Under vmap, autograd records below the batched wrapper, which never requires grad.
    return torch.is_grad_enabled() and _compat.functorch_base(t).requires_grad


def _storage_id(t: torch.Tensor):
    # Under vmap the mode sees batched wrappers; the storage is the batch's.
    return _compat.storage_key(_compat.functorch_base(t))
