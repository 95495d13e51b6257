"""vmap of a conditional, and running every branch then selecting on the device.

* Selector the same for every example: each branch is vmapped and the conditional
  stays one conditional (one node when traced).
* Selector batched (one value per example): no single branch can be chosen, so
  every branch runs on the whole batch and one fused select (``select_ops.py``) picks,
  per example, the taken branch's value of every output leaf.

``run_all_and_select`` is that second form on its own; ``strategy="select"`` uses it
too, to avoid reading a device predicate on the host.

Gradients must not pick up NaN or Inf from an example that did not take a branch:
``cond(x > 0, torch.log, torch.zeros_like)`` evaluates ``log`` on negative examples,
whose backward is ``inf``. Multiplying by a zero cotangent would give ``0 * inf =
NaN``, so each branch's inputs also go through a select (``select(mask, x,
x.detach())``) whose backward *reads only* the taken examples' gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import _compat, select_ops
from .errors import BranchMismatchError
from .forms import Form
from .tracing import SpecCarrier, checked_output_paths, operand_paths
from .write_guard import refusing_outside_writes


def vmap_rule(form: Form, interpreter, selector, branches, operands):
    """The functorch Vmap-key rule of both operators."""
    level = interpreter.level()
    if isinstance(selector, torch.Tensor) and _compat.batched_at(selector, level):
        # A branch per example: every branch runs on the whole batch and one select
        # picks per example. The branches run at this vmap level, not below it, so
        # that tensors a branch closes over are batched as its operands are; the
        # select runs below it, on the batch's own tensors.
        labels = form.labels(len(branches))
        which, first, outputs = run_every_branch(form, selector, branches, operands, labels)
        size = interpreter.batch_size()
        which, first = (
            _batch_first(t, level, size) if t is not None else None for t in (which, first)
        )
        outputs = [[_batch_first(t, level, size) for t in outs] for outs in outputs]
        with interpreter.lower():
            out = select_outputs(which, first, outputs)
        return tuple(_compat.batch(t, 0, level) for t in out)
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
            interpreter.batch_size(),
            interpreter.randomness(),
        )
    return tuple(_compat.batch(t, 0, level) for t in out)


def map_conditional(
    form: Form, selector, selector_dim, branches, operands, in_dims, batch_size, randomness
) -> tuple:
    """The conditional mapped over a batch (dims as vmap gives them); outputs batch-first.

    One selector for the batch keeps one conditional of vmapped branches; a selector
    per example runs every branch and selects.
    """
    if selector_dim is None:
        mapped = vmapped_branches(branches, in_dims, randomness)
        return tuple(form.op(selector, *mapped, tuple(operands)))
    return run_all_and_select_batched(
        form, selector.movedim(selector_dim, 0), branches, operands, in_dims, batch_size, randomness
    )


def _unbatch_all(operands, level):
    if not operands:
        return (), ()
    tensors, in_dims = zip(*[_compat.unbatch(t, level) for t in operands])
    return tensors, in_dims


def vmapped_branches(branches: Sequence[Callable], in_dims: Sequence, randomness: str):
    """Each branch under ``torch.vmap``, batch dimension first on every output."""
    return [
        SpecCarrier(torch.vmap(b, in_dims=tuple(in_dims), out_dims=0, randomness=randomness), b)
        for b in branches
    ]


def run_all_and_select_batched(
    form: Form, selector, branches, tensors, in_dims, batch_size: int, randomness: str
):
    """Every branch vmapped over the batch, then one select per example.

    ``selector`` has the batch dimension first (one value per example); operands are
    given with their batch dimension (or None when unbatched).
    """
    inputs = [
        t.movedim(d, 0) if d is not None else _broadcast_batch(t, batch_size)
        for t, d in zip(tensors, in_dims)
    ]
    dims = tuple(0 if isinstance(t, torch.Tensor) else None for t in inputs)
    mapped = vmapped_branches(branches, dims, randomness)
    return run_all_and_select(form, selector, mapped, inputs, form.labels(len(branches)))


def run_all_and_select(
    form: Form, selector: torch.Tensor, branches, operands, labels: Sequence[str]
) -> tuple:
    """Run every branch on ``operands``, then pick each output element on the device.

    ``selector``'s shape is a prefix of every operand's and output's shape (0-d: one
    choice for everything). No value is read on the host.
    """
    return select_outputs(*run_every_branch(form, selector, branches, operands, labels))


def run_every_branch(form: Form, selector: torch.Tensor, branches, operands, labels: Sequence[str]):
    """Every branch's outputs, and what picks between them: ``(which, first, outputs)``.

    ``first`` holds where branch 0 is taken; ``which`` is the branch index, or None
    for cond (``first`` is then the predicate). A branch may not write to anything it
    did not create (it runs even when not taken); outputs are checked to be
    selectable, with errors naming output paths.
    """
    n = len(branches)
    if n == 2 and selector.dtype is torch.bool:  # cond: the predicate is the mask
        which, first = None, selector
    else:
        which = form.branch_of(selector, n)
        first = which == 0
    guarded = [i for i, t in enumerate(operands) if isinstance(t, torch.Tensor) and _needs_grad(t)]
    names = lambda: operand_paths(branches, len(operands))  # noqa: E731  (for messages only)
    outputs = []
    for k, branch in enumerate(branches):
        inputs = operands
        if guarded:
            mask = first if k == 0 else (~first if which is None else which == k)
            inputs = _masked(mask, operands, guarded)
        with refusing_outside_writes(labels[k], inputs, names):
            outputs.append(tuple(branch(*inputs)))
    _check_selectable(branches, labels, outputs)
    return which, first, outputs


def select_outputs(which, first, outputs) -> tuple:
    """One fused select over every output (see ``run_every_branch``)."""
    if which is None or len(outputs) == 2:
        return tuple(select_ops.select(first, outputs[0], outputs[1]))
    return tuple(select_ops.select_n(which, outputs))


def _batch_first(t: torch.Tensor, level: int, size: int) -> torch.Tensor:
    """The batch's own tensor for ``t`` at vmap ``level``, batch dimension first."""
    physical, dim = _compat.unbatch(t, level)
    return physical.movedim(dim, 0) if dim is not None else _broadcast_batch(physical, size)


def run_as_conditional_nodes(form: Form, selector, branches, operands, labels, if_body) -> tuple:
    """Each branch captured into its own IF node of the CUDA graph being captured.

    On replay exactly one node runs, chosen on the device. The first branch's
    outputs are the results; every later branch copies its outputs into them (the
    graph after the nodes reads fixed addresses), as PyTorch's own conditional
    nodes do. Gradients are not recorded through the copies: callers use this only
    when no operand needs one.
    """
    which = form.branch_of(selector, len(branches))
    results: tuple = ()
    for k, branch in enumerate(branches):
        with if_body(which == k):
            outputs = tuple(branch(*operands))
            if k == 0:
                results = outputs
                continue
            _check_selectable([branches[0], branch], [labels[0], labels[k]], [results, outputs])
            for result, output in zip(results, outputs):
                result.copy_(output)
    return results


def any_needs_grad(operands) -> bool:
    return any(_needs_grad(t) for t in operands if isinstance(t, torch.Tensor))


def _check_selectable(branches, labels, outputs) -> None:
    paths = checked_output_paths(branches, labels, len(outputs[0]))
    for label, outs in zip(labels[1:], outputs[1:]):
        for path, first, other in zip(paths, outputs[0], outs):
            for what, a, b in (
                ("shape", tuple(first.shape), tuple(other.shape)),
                ("dtype", first.dtype, other.dtype),
                ("device", first.device, other.device),
            ):
                if a != b:
                    raise BranchMismatchError(
                        f"{path}: every branch runs and each element is selected on the "
                        "device (strategy='select', or vmap with a per-example "
                        f"selector), so branches must agree on {what}: {labels[0]} "
                        f"gives {a}, {label} gives {b}"
                    )


def _masked(mask: torch.Tensor, operands, guarded) -> list:
    """``operands`` unchanged forward; the backward of those at ``guarded`` reads only
    the examples ``mask`` selects (one fused select for all of them)."""
    values = [operands[i] for i in guarded]
    masked = select_ops.select(mask, values, [v.detach() for v in values])
    inputs = list(operands)
    for i, value in zip(guarded, masked):
        inputs[i] = value
    return inputs


def _needs_grad(t: torch.Tensor) -> bool:
    if not (t.dtype.is_floating_point or t.dtype.is_complex):
        return False
    if torch.is_grad_enabled() and t.requires_grad:
        return True
    # dynamo sees no functorch wrappers (and cannot trace the query)
    return not _compat.is_dynamo_compiling() and _compat.is_differentiated_by_transform(t)


def _broadcast_batch(value, batch_size: int):
    if not isinstance(value, torch.Tensor):
        return value
    return value.expand(batch_size, *value.shape)
