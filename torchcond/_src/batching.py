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

from collections.abc import Callable, Sequence

import torch

from .. import _C, _compat
from ..errors import BranchMutationError
from .closures import Mapped
from .forms import Form
from .strategies import run_every_branch, select_outputs
from .tracing import written_back


def vmap_rule(form: Form, interpreter, selector, branches, operands):
    """The functorch Vmap-key rule of both operators."""
    level = interpreter.level()
    if isinstance(selector, torch.Tensor) and _compat.batched_at(selector, level):
        return per_example(form, level, interpreter.batch_size(), selector, branches, operands)
    tensors, in_dims = _unbatch_all(operands, level)
    selector, selector_dim = _compat.unbatch(selector, level)
    with interpreter.lower():
        out = map_conditional(
            form,
            selector,
            selector_dim,
            branches,
            tensors,
            in_dims,
            interpreter.randomness(),
        )
    return tuple(_compat.batch(t, 0, level) for t in out)


def per_example(form: Form, level: int, size: int, selector, branches, operands) -> tuple:
    """The rule for a selector batched at vmap ``level`` (a batch of ``size``).

    A branch per example: every branch runs on the whole batch and one select picks
    per example. The branches run at this vmap level, not below it, so that tensors a
    branch closes over are batched as its operands are; the select runs below it, on
    the batch's own tensors.
    """
    labels = form.labels(len(branches))
    every = run_every_branch(form, selector, branches, operands, labels)
    which, first = _C.batch_first([every.which, every.first], level, size)
    outputs = [_C.batch_first(outs, level, size) for outs in every.outputs]
    targets = {i: _written_per_example(operands[i], i, level, labels) for i in every.written}
    vmap_level = _compat.pop_vmap_level()  # the level's lower(), without its generator
    try:
        out = select_outputs(which, first, outputs)
        out = written_back(out, every.written, lambda i, value: targets[i].copy_(value))
    finally:
        _compat.push_vmap_level(vmap_level)
    # An output every branch returns unchanged keeps its own batching (none, say).
    return every.merged(_C.batched(out, level))


def map_conditional(
    form: Form, selector, selector_dim, branches, operands, in_dims, randomness
) -> tuple:
    """The conditional mapped over a batch (dims as vmap gives them); outputs batch-first.

    One selector for the batch keeps one conditional of vmapped branches; a selector
    per example runs every branch and selects.
    """
    if selector_dim is None:
        mapped = vmapped_branches(branches, in_dims, randomness)
        return tuple(form.op(selector, *mapped, tuple(operands)))

    # The conditional per example, whose vmap rule (above) runs every branch and selects.
    def per_example(selector, *operands):
        return tuple(form.op(selector, *branches, operands))

    mapped = torch.vmap(per_example, in_dims=(selector_dim, *in_dims), randomness=randomness)
    return mapped(selector, *operands)


def _unbatch_all(operands, level):
    if not operands:
        return (), ()
    tensors, in_dims = zip(*[_compat.unbatch(t, level) for t in operands])
    return tensors, in_dims


def vmapped_branches(branches: Sequence[Callable], in_dims: Sequence, randomness: str):
    """Each branch under ``torch.vmap``, batch dimension first on every output."""
    return [Mapped(b, tuple(in_dims), randomness) for b in branches]


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
