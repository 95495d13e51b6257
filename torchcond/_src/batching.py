"""vmap of a conditional.

* Selector the same for every example: each branch is vmapped and the conditional
  stays one conditional (one node when traced).
* Selector batched (one value per example): no single branch can be chosen, so
  every branch runs on the whole batch and one fused select (``select_ops.py``) picks,
  per example, the taken branch's value of every output leaf.

The second form is ``strategies.run_every_branch`` at the vmap level, then one
select below it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import _C, _compat
from ..errors import BranchMutationError
from .closures import UNBATCHED, Mapped
from .kinds import ConditionalKind
from .strategies import run_every_branch, select_outputs
from .subgraph import returned_inputs
from .tracing import logical_sizes, plain, written_back


def vmap_rule(kind: ConditionalKind, interpreter, selector, branches, operands):
    """The functorch Vmap-key rule of both operators."""
    level = interpreter.level()
    size = interpreter.batch_size()
    if isinstance(selector, torch.Tensor) and _compat.batched_at(selector, level):
        return per_example(kind, level, size, selector, branches, operands)
    # One selector for the batch: one conditional of mapped branches, below this level.
    tensors, in_dims = _unbatch_all(operands, level)
    unchanged = _Unchanged(len(branches))
    mapped = [
        Mapped(b, in_dims, size, interpreter.randomness(), level, unchanged.reporter(k))
        for k, b in enumerate(branches)
    ]
    with interpreter.lower():
        out = kind.op(selector, *mapped, tensors)
    # As a Python ``if`` returns them: an output every branch returns unchanged is
    # that operand or closure, with its own batching; one that no branch varies over
    # the batch is not batched.
    kept = unchanged.same(
        lambda source: (
            source is UNBATCHED
            or (isinstance(source, int) and in_dims[source] is None)
            or (isinstance(source, torch.Tensor) and not _compat.batched_at(source, level))
        )
    )
    return tuple(
        _batched_as(kept[j], t, operands, level) if j in kept else _compat.batch(t, 0, level)
        for j, t in enumerate(out)
    )


def _copied_operands(branches) -> dict[int, int]:
    """Output position -> the operand every branch returns a copy of, where every
    branch is a graph (``subgraph.returned_inputs``)."""
    graphs = [plain(b) for b in branches]
    if not all(isinstance(gm, torch.fx.GraphModule) for gm in graphs):
        return {}
    first, *rest = [returned_inputs(gm) for gm in graphs]
    return {j: i for j, i in first.items() if all(r.get(j) == i for r in rest)}


def per_example(
    kind: ConditionalKind, level: int, size: int, selector, branches, operands
) -> tuple:
    """The rule for a selector batched at vmap ``level`` (a batch of ``size``).

    A branch per example: every branch runs on the whole batch and one select picks
    per example. The branches run at this vmap level, not below it, so that tensors a
    branch closes over are batched as its operands are; the select runs below it, on
    the batch's own tensors.
    """
    labels = kind.labels(len(branches))
    copies = _copied_operands(branches)
    runs = [logical_sizes(b) for b in branches]
    every = run_every_branch(kind, selector, runs, operands, labels)
    which, first = _C.batch_first([every.which, every.first], level, size)
    outputs = [_C.batch_first(outs, level, size) for outs in every.outputs]
    targets = {i: _written_per_example(operands[i], i, level, labels) for i in every.written}
    vmap_level = _compat.pop_vmap_level()  # the level's lower(), without its generator
    try:
        out = select_outputs(which, first, outputs)
        out = written_back(out, every.written, lambda i, value: targets[i].copy_(value))
    finally:
        _compat.push_vmap_level(vmap_level)
    # An output every branch returns unchanged keeps its own batching (none, say);
    # so does a copy of an operand every branch graph returns (a traced identity).
    out = every.merged(_C.batched(out, level))
    return tuple(
        operands[copies[j]].clone() if j in copies and j not in every.same else t
        for j, t in enumerate(out)
    )


def map_conditional(
    kind: ConditionalKind,
    selector,
    selector_dim,
    branches,
    operands,
    in_dims,
    batch_size,
    randomness,
) -> tuple:
    """The conditional mapped over a batch (dims as vmap gives them); outputs batch-first.

    One selector for the batch keeps one conditional of mapped branches; a selector
    per example runs every branch and selects.
    """
    if selector_dim is None:
        each = [Mapped(b, tuple(in_dims), batch_size, randomness) for b in branches]
        return tuple(kind.op(selector, *each, tuple(operands)))

    # The conditional per example, whose vmap rule (above) runs every branch and selects.
    def one_example(selector, *operands):
        return tuple(kind.op(selector, *branches, operands))

    mapped = torch.vmap(one_example, in_dims=(selector_dim, *in_dims), randomness=randomness)
    return mapped(selector, *operands)


def _unbatch_all(operands, level) -> tuple[tuple, tuple]:
    if not operands:
        return (), ()
    tensors, in_dims = zip(*[_compat.unbatch(t, level) for t in operands])
    return tensors, in_dims


class _Unchanged:
    """What each branch's outputs are, output by output, in every run of it (``Mapped``
    reports it): where all runs agree, the conditional's output is that value."""

    def __init__(self, n_branches: int):
        self._runs: list[list[tuple]] = [[] for _ in range(n_branches)]

    def reporter(self, k: int) -> Callable[[tuple], None]:
        return self._runs[k].append

    def same(self, unbatched: Callable[[object], bool]) -> dict[int, object]:
        """Output position -> an operand's position or a closure, the same in every run
        (the branches a trace runs, or the one a readable selector takes), or
        ``UNBATCHED`` where every run's is ``unbatched``."""
        runs = [run for branch in self._runs for run in branch]
        kept: dict[int, object] = {}
        for j, source in enumerate(runs[0] if runs else ()):
            if source is not None and all(_same_source(run[j], source) for run in runs[1:]):
                kept[j] = source
            elif all(unbatched(run[j]) for run in runs):
                kept[j] = UNBATCHED
        return kept


def _same_source(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return a is b


def _batched_as(source, out: torch.Tensor, operands, level: int):
    """The output ``Mapped`` found to be ``source`` in every run; ``out``, the
    conditional's (batch first), where it is ``UNBATCHED``."""
    if source is UNBATCHED:
        return out.select(0, 0) if out.shape[0] else _compat.batch(out, 0, level)
    return operands[source] if isinstance(source, int) else source


def _written_per_example(operand: torch.Tensor, i: int, level: int, labels) -> torch.Tensor:
    """The batch's own tensor of an operand a branch writes to, batch dimension first.

    Each example takes its own branch's value: an operand without a batch dimension
    at this level has no room for them, as a Python ``if`` under vmap would find.
    """
    physical, dim = _compat.unbatch(operand, level)
    if dim is None:
        raise BranchMutationError.at(
            "operand",
            i,
            f"a branch ({' or '.join(labels)}) writes in place to {{path}}, which is not "
            "batched, but the selector is: each example takes its own branch, so the "
            "written value differs per example. Batch the operand (in_dims), or return "
            "the new value instead",
        )
    return physical.movedim(dim, 0)
