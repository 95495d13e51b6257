"""vmap of a conditional.

* When the selector is the same for every example, each branch is vmapped. The
  conditional stays one conditional, which is one node when traced.
* When the selector is batched (one value per example), no single branch can be
  chosen. Every branch runs on the whole batch. One fused select (``select_ops.py``)
  then picks, per example, the taken branch's value of every output leaf.

The second form runs ``strategies.run_every_branch`` at the vmap level, then one
select below it. Its eager common case, without a gradient, is one C call that
``api.cond`` makes first (``per_example_cond`` in csrc/batching.cpp). That call hands
anything else back before or after running the branches, and this rule does it all.
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
    # One selector for the batch gives one conditional of mapped branches, below this level.
    tensors, in_dims = _unbatch_all(operands, level)
    unchanged = _Unchanged(len(branches))
    mapped = [
        Mapped(b, in_dims, size, interpreter.randomness(), level, unchanged.reporter(k))
        for k, b in enumerate(branches)
    ]
    with interpreter.lower():
        out = kind.op(selector, *mapped, tensors)
    # Return outputs as a Python ``if`` would. An output that every branch returns
    # unchanged is that operand or closure, with its own batching. An output that no
    # branch varies over the batch is not batched.
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
    """Map each output position to the operand that every branch returns a copy of.
    This needs every branch to be a graph (``subgraph.returned_inputs``)."""
    graphs = [plain(b) for b in branches]
    if not all(isinstance(gm, torch.fx.GraphModule) for gm in graphs):
        return {}
    first, *rest = [returned_inputs(gm) for gm in graphs]
    return {j: i for j, i in first.items() if all(r.get(j) == i for r in rest)}


def per_example(
    kind: ConditionalKind, level: int, size: int, selector, branches, operands
) -> tuple:
    """The rule for a selector batched at vmap ``level``, with a batch of ``size``.

    Each example takes its own branch. Every branch runs on the whole batch, and one
    select picks per example. The branches run at this vmap level, not below it, so
    tensors that a branch closes over are batched as its operands are. The select runs
    below the level, on the batch's own tensors.
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
    # An output that every branch returns unchanged keeps its own batching, which may
    # be none. So does a copy of an operand that every branch graph returns, such as a
    # traced identity.
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
    """Map the conditional over a batch, with dims as vmap gives them. Outputs are batch-first.

    One selector for the batch keeps one conditional of mapped branches. A selector per
    example runs every branch and selects.
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
    """Records where each branch's outputs come from in every run (``Mapped`` reports
    it). Where all runs agree, the conditional's output is that source."""

    def __init__(self, n_branches: int):
        self._runs: list[list[tuple]] = [[] for _ in range(n_branches)]

    def reporter(self, k: int) -> Callable[[tuple], None]:
        return self._runs[k].append

    def same(self, unbatched: Callable[[object], bool]) -> dict[int, object]:
        """Map each output position to an operand's position or a closure that is the
        same in every run, or to ``UNBATCHED`` where every run's source is ``unbatched``.
        The runs are of the branches a trace runs, or the one a readable selector takes."""
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
    """Return the output that ``Mapped`` found to be ``source`` in every run. For
    ``UNBATCHED``, build it from ``out``, the conditional's batch-first output."""
    if source is UNBATCHED:
        return out.select(0, 0) if out.shape[0] else _compat.batch(out, 0, level)
    return operands[source] if isinstance(source, int) else source


def _written_per_example(operand: torch.Tensor, i: int, level: int, labels) -> torch.Tensor:
    """Return the batch's own tensor of an operand that a branch writes to, batch first.

    Each example takes its own branch's value. An operand with no batch dimension at
    this level has no room for those values, as a Python ``if`` under vmap would find.
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
