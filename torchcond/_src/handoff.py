"""Branches that already ran in this call, as the general path takes them.

The eager one-call paths in C++ (``select_cond`` and ``per_example_cond`` in
csrc/batching.cpp) run the branches first. When they cannot finish the call, they
return a ``torchcond._C.Handoff``: the outputs of the branches that ran and settled,
and the one that ran without settling, if any. This module settles that branch as the
general path would have, once: its state through ``state.watch_after``, its writes
through ``write_guard``. Each branch that ran becomes a ``Ran``. The general path
takes a ``Ran``'s result where it would call the branch (``pytrees.FlatBranch``), so
no branch runs twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _C
from .._compat import pytree
from ..errors import BranchMutationError
from .state import watch_after
from .write_guard import BranchWrites

Handoff = _C.Handoff


class Ran:
    """A branch's call that already happened: its output or its error, and the new
    values of the operands it wrote to. ``result`` gives it once."""

    __slots__ = ("error", "out", "used", "writes")

    def __init__(self, out=None, error: BaseException | None = None, writes=None):
        self.out = out
        self.error = error
        self.writes: dict[int, torch.Tensor] = writes or {}
        self.used = False

    def result(self, operands: Sequence):
        """Return the output, or raise the error, as calling the branch on ``operands``
        did. Its writes land again as ``copy_`` into the operands, so that the general
        path's recorder selects them as it would the branch's own."""
        if self.used:
            raise AssertionError("torchcond: a branch that ran would run again")
        self.used = True
        if self.error is not None:
            raise self.error
        for i, value in self.writes.items():
            operands[i].copy_(value)
        return self.out


def taken_over(handoff: Handoff, labels: Sequence[str], operands: Sequence) -> list[Ran]:
    """Return a ``Ran`` for each branch that ``handoff`` says ran, in order."""
    ran = [Ran(out) for out in handoff.outputs]
    if handoff.stop >= 0:
        ran.append(_settled(handoff, labels[len(ran)], operands))
    return ran


def _settled(handoff: Handoff, label: str, operands: Sequence) -> Ran:
    """Settle the branch that ran without settling, as the general path settles a branch
    it runs (``state.run_branch`` inside ``BranchWrites.run_all``, both through
    ``_C.run_untaken``). What it changed outside itself is put back or refused; what it
    wrote to its operands is taken and undone, or undone and refused."""
    error = handoff.error
    try:
        watch_after(handoff.record, label, handoff.assigned, error is not None, under_select=True)
    except BranchMutationError as state_refused:
        error = state_refused
    leaves, spec = pytree.tree_flatten(handoff.out)
    writes = BranchWrites(operands, [False] * len(operands))
    try:
        outputs, values = writes.settle(label, handoff.recorder, error, leaves)
    except BaseException as failed:  # the branch's error, or the refusal of its write
        return Ran(error=failed)
    return Ran(pytree.tree_unflatten(list(outputs), spec), writes=values)
