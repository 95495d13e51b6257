"""How a conditional runs when the host cannot, or should not, pick the branch.

There are three strategies, and one rule chooses between them:

* **the taken branch** (``"auto"``, the default). The host reads the selector, and
  only that branch runs. This strategy lives outside this module, in the eager fast
  path in ``api.py`` and in the operators' dense rule.
* **run every branch, then select** (``"select"``, or vmap with a per-example
  selector). Every branch runs, and one fused select (``select_ops.py``) picks each
  output element on the device. The host reads nothing. Eagerly without a gradient,
  ``cond`` of two Python functions does this in one C call first
  (csrc/batching.cpp), which leaves anything else to ``run_all_and_select``.
* **CUDA graph conditional nodes**. While a CUDA graph captures and no gradient is
  needed, each branch is captured into its own IF node, and the device picks.

``chooses_select`` is the rule, and ``runner`` runs the choice. A new strategy needs a
name in the ``Strategy`` literal, a case in each of these two, and a function that
runs it.

When every branch runs, gradients must not pick up NaN or Inf from an example that
did not take a branch. For example, ``cond(x > 0, torch.log, torch.zeros_like)``
evaluates ``log`` on negative examples, whose backward is ``inf``. Multiplying by a
zero cotangent would give ``0 * inf = NaN``. So each branch's inputs also go through a
select (``select(mask, x, x.detach())``) whose backward *reads only* the taken
examples' gradients. These inputs are the branch's operands and the tensors it closes
over (read through ``closures.StandIns``), where they need a gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple, get_args

import torch

from .. import _compat
from ..errors import CondArgumentError
from . import select_ops
from .closures import StandIns
from .kinds import ConditionalKind, as_scalar, python_scalar
from .merge import check_agreement
from .state import every_branch_runs, refuse_autograd_state
from .tracing import written_back
from .untraced import labelled_inputs, refuse_unexported_in_dynamo, refuse_untraced
from .write_guard import BranchWrites, needs_grad, shares_storage

# The accepted values. cond and switch annotate ``strategy`` with this type for type
# checkers, and STRATEGIES checks it at run time.
Strategy = Literal["auto", "select"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


def chooses_select(strategy: str, selector) -> bool:
    """Whether every branch runs. It does for ``"select"``, unless the selector is a
    Python number, which picks on the host for free. It also does while a CUDA graph captures."""
    if strategy not in STRATEGIES:
        raise CondArgumentError(
            f"argument 'strategy' must be one of {', '.join(map(repr, STRATEGIES))}; "
            f"found {strategy!r}"
        )
    if strategy == "select":
        return not isinstance(python_scalar(selector), (bool, int, float))
    return isinstance(selector, torch.Tensor) and _compat.capturing_cuda_graph(selector)


def runner(kind: ConditionalKind, selector: torch.Tensor, strategy: str) -> Callable:
    """Return ``run(branches, operands, labels)`` for a selector ``chooses_select`` accepted.
    ``strategy="auto"`` gets here only while a CUDA graph captures. The branches then
    go into CUDA conditional nodes, if PyTorch and the runtime support them and no
    gradient is needed. Otherwise every branch runs and one select picks."""
    if_body = _compat.cuda_graph_if_body() if strategy == "auto" else None

    def run(branches, operands, labels):
        if if_body is not None and not any_needs_grad(operands):
            return run_as_conditional_nodes(kind, selector, branches, operands, labels, if_body)
        return run_all_and_select(kind, selector, branches, operands, labels)

    return run


def run_all_and_select(
    kind: ConditionalKind, selector: torch.Tensor, branches, operands, labels: Sequence[str]
) -> tuple:
    """Run every branch on ``operands``, then pick each output element on the device.

    ``selector``'s shape is a prefix of every operand's and output's shape. A 0-d
    selector makes one choice for everything. The host reads no value. An operand that
    some branch writes to is selected the same way and takes the selected value.
    """
    traced = _compat.tracing_active()  # export's refusals (untraced.py) need a trace
    if traced:
        refuse_unexported_in_dynamo(kind.name)
        refuse_untraced(kind.name, labelled_inputs(selector, operands, len(operands)))
    every = run_every_branch(kind, selector, branches, operands, labels)
    if traced:
        outputs = [(f"an output of {labels[k]}", v) for k, o in enumerate(every.outputs) for v in o]
        refuse_untraced(kind.name, outputs)
    out = select_outputs(every.which, every.first, every.outputs)
    out = written_back(out, every.written, lambda i, value: operands[i].copy_(value))
    return every.merged(out)


class EveryBranch(NamedTuple):
    """What ``run_every_branch`` found: every branch's outputs and what picks between them.

    ``first`` is where branch 0 is taken. ``which`` is the branch index, or None for
    cond, where ``first`` is the predicate. ``outputs`` holds, per branch, the outputs
    to select (those not in ``same``). The values of the operands at ``written`` after
    that branch follow them. A branch that left such an operand alone gives its old
    value. ``same`` maps an output position to the tensor that every branch returned
    there. A Python ``if`` would return that tensor whichever branch it took, so it
    needs no select.
    """

    which: torch.Tensor | None
    first: torch.Tensor
    outputs: list[tuple]
    written: list[int]
    same: dict[int, torch.Tensor]

    def merged(self, selected: Sequence) -> tuple:
        """Return the conditional's outputs. They are ``selected``, without the written
        operands, with the ``same`` outputs put back in their places."""
        if not self.same:
            return tuple(selected)
        rest = iter(selected)
        n = len(selected) + len(self.same)
        return tuple(self.same[j] if j in self.same else next(rest) for j in range(n))


def run_every_branch(
    kind: ConditionalKind, selector: torch.Tensor, branches, operands, labels: Sequence[str]
) -> EveryBranch:
    """Run every branch on ``operands`` and return an ``EveryBranch``.

    Each branch's differentiable inputs are masked to the examples that take it (see
    the module docstring). These inputs are its operands and the tensors it closes
    over. A branch's writes to operands are undone after it runs (write_guard.py). The
    outputs are checked to be selectable, and the errors name output paths.
    """
    n = len(branches)
    if n == 2 and selector.dtype is torch.bool:  # cond, where the predicate is the mask
        which, first = None, as_scalar(selector)
    else:
        which = kind.branch_indices(selector, n)
        first = which == 0
    grad_mode = torch.is_grad_enabled()
    differentiable = grad_mode or _compat.differentiating_transforms_active()
    # A write is refused to an operand that needs a gradient now.
    if differentiable:
        refused = [isinstance(t, torch.Tensor) and needs_grad(t) for t in operands]
    else:
        refused = [False] * len(operands)
    later = _differentiated_later()
    guards = _gradient_guard(grad_mode, differentiable, later)
    # Operands whose gradient only the taken examples may feed.
    if later:
        guarded = [i for i, t in enumerate(operands) if isinstance(t, torch.Tensor) and guards(t)]
    else:
        guarded = [i for i, r in enumerate(refused) if r]
    writes = BranchWrites(operands, refused, owning=differentiable)
    # Here a branch may not assign a buffer or change other Python state (state.py).
    with every_branch_runs("select"):
        if differentiable or guarded:
            # The masks and the select keep the predicate for the backward. A branch may
            # write an operand that the predicate is a view of, so they keep a copy.
            if which is None and not _compat.is_dynamo_compiling():
                if any(isinstance(t, torch.Tensor) and shares_storage(first, t) for t in operands):
                    first = first.clone()
            # Each branch reads its operands masked to the examples that take it, and
            # writes its own copies of them (BranchWrites.run_owning).
            outputs, values, given = [], [], []
            for k, (branch, label) in enumerate(zip(branches, labels)):
                mask = _mask(first, which, k)
                inputs = _masked(mask(), operands, guarded) if guarded else operands
                reads = _closures_masked(mask, inputs, writes, guards, grad_mode, label)
                outs, new_values = writes.run_owning(label, branch, inputs, reads)
                outputs.append(outs)
                values.append(new_values)
                given.append(inputs)
        else:  # every branch reads the operands themselves
            outputs, values = writes.run_all(labels, branches, operands)
            given = None
    check_agreement(outputs, labels, selected=True)
    return _every_branch(which, first, outputs, values, given, operands)


def _every_branch(which, first, outputs, values, given, operands) -> EveryBranch:
    """Build the ``EveryBranch``. Each branch's outputs to select leave out those that
    every branch returns alike, and end with the written operands' values."""
    same = _same_outputs(outputs, given, operands)
    written = sorted({i for mine in values for i in mine}) if any(values) else []
    if same or written:
        outputs = [
            (
                *(o for j, o in enumerate(outs) if j not in same),
                *(mine.get(i, operands[i]) for i in written),
            )
            for outs, mine in zip(outputs, values)
        ]
    return EveryBranch(which, first, outputs, written, same)


def _mask(first: torch.Tensor, which: torch.Tensor | None, k: int) -> Callable:
    """Return a function that gives where branch ``k`` is taken, computed on first use."""
    made: list[torch.Tensor] = []  # a list, for the reason in pytrees.Outputs

    def mask() -> torch.Tensor:
        if not made:
            made.append(first if k == 0 else ~first if which is None else which == k)
        return made[0]

    return mask


def _gradient_guard(
    grad_mode: bool, differentiable: bool, later: bool
) -> Callable[[torch.Tensor], bool]:
    """Return a test for the tensors a branch reads masked. Their gradient then comes
    only from the examples that take the branch. The test picks tensors that need a
    gradient now. If the program may be differentiated later (``later``), it picks
    every floating tensor."""
    if later:
        return _differentiable_dtype
    if not differentiable:
        return lambda t: False

    def now(t: torch.Tensor) -> bool:
        # Use the conditional's grad mode. The branch may first read the tensor under
        # no_grad.
        with torch.set_grad_enabled(grad_mode):
            return needs_grad(t)

    return now


def _differentiated_later() -> bool:
    """Whether the traced program may be differentiated later, whatever its inputs need
    now. That holds for a make_fx or torch.export trace. torch.compile guards on
    requires_grad and retraces when it changes. But under torch.func it shows wrapped
    tensors, which never read as requiring grad."""
    if not _compat.tracing_active():
        return False
    if not _compat.is_dynamo_compiling() or _compat.is_exporting():
        return True
    return torch.is_grad_enabled() and _compat.transforms_active()


def _differentiable_dtype(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


def _closures_masked(
    mask: Callable[[], torch.Tensor],
    inputs,
    writes: BranchWrites,
    guards,
    grad_mode: bool,
    label: str,
):
    """Return a context that masks each closed-over tensor that ``guards`` picks, as
    ``_masked`` does for operands. ``label`` names the branch."""

    def stand_in(t: torch.Tensor) -> torch.Tensor:
        writes.note_closure_read(t)
        if not guards(t):
            return t
        refuse_untraced(label, [("a tensor it closes over", t)])
        # Use the conditional's grad mode, not the branch's at the point of the read.
        with torch.set_grad_enabled(grad_mode):
            where = mask()
            if where.device != t.device and where.device.type != "cpu":
                where = where.to(t.device)  # a CPU scalar beside CUDA tensors, say
            (masked,) = _mask_gradients(where, [t])
        writes.stand_in(masked)
        return masked

    def changing(t: torch.Tensor, what: str) -> None:
        # The change would land on the stand-in and be lost, taken or not. A tensor
        # read as itself changes, and ``run_branch``'s watch refuses that with its name.
        if guards(t):
            refuse_autograd_state(label, what, t, None)

    return StandIns(inputs, stand_in, changing=changing, swaps=guards)


def _same_outputs(outputs, given, operands) -> dict[int, torch.Tensor]:
    """Return the output positions where every branch returns the same tensor. That is
    the same operand (a branch's masked stand-in counts as the operand), or the same
    object. ``given`` is None when every branch read the operands themselves."""
    first, rest = outputs[0], outputs[1:]
    same = {}
    for j, out in enumerate(first):
        value = out if given is None else _original(out, given[0], operands)
        for k, outs in enumerate(rest):
            other = outs[j]
            if other is not value and (
                given is None or _original(other, given[k + 1], operands) is not value
            ):
                break
        else:
            same[j] = value
    return same


def _original(out, inputs, operands):
    """Return the operand that ``out`` is, if it is one of ``inputs``, or else ``out``.
    ``inputs`` is the branch's view of ``operands``."""
    for i, t in enumerate(inputs):
        if out is t:
            return operands[i]
    return out


def select_outputs(which, first, outputs) -> tuple:
    """One fused select over every output (see ``run_every_branch``)."""
    if not outputs[0]:
        return ()
    if which is None or len(outputs) == 2:
        return tuple(select_ops.select_lists(first, list(outputs[0]), list(outputs[1])))
    return tuple(select_ops.select_n(which, outputs))


def run_as_conditional_nodes(
    kind: ConditionalKind, selector, branches, operands, labels, if_body
) -> tuple:
    """Capture each branch into its own IF node of the CUDA graph being captured.

    On replay the device picks exactly one node to run. The first branch's outputs are
    the results. Every later branch copies its outputs into them, because the graph
    after the nodes reads fixed addresses. PyTorch's own conditional nodes do the same.
    Autograd records nothing through the copies, so callers use this only when no
    operand needs a gradient.
    """
    which = kind.branch_indices(selector, len(branches))
    results: tuple = ()
    for k, branch in enumerate(branches):
        with if_body(which == k):
            outputs = tuple(branch(*operands))
            if k == 0:
                results = outputs
                continue
            check_agreement([results, outputs], [labels[0], labels[k]], selected=True)
            for result, output in zip(results, outputs):
                result.copy_(output)
    return results


def any_needs_grad(operands) -> bool:
    return any(needs_grad(t) for t in operands if isinstance(t, torch.Tensor))


def _mask_gradients(mask: torch.Tensor, values) -> list:
    """Return ``values`` unchanged. Their backward keeps gradients only where ``mask`` is set."""
    if _compat.tracing_active():
        # torch.where's derivative masks again, so a traced program's second order is
        # safe too. Under torch.compile a fused select would be saved, and its
        # second-order gradient would be dropped without an error.
        return [torch.where(mask, v, _without_gradient(v)) for v in values]
    return select_ops.select(mask, values, [v.detach() for v in values])


# Integer dtypes by element size, for _without_gradient.
_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _without_gradient(v: torch.Tensor) -> torch.Tensor:
    """Return ``v``'s values with no gradient, in a traced program too. From torch 2.14,
    make_fx records ``detach`` as ``alias``, which a replay differentiates. A view as
    integers and back is never differentiated. torch 2.11 has no vmap rule for that
    view, and it records ``detach`` as such."""
    as_int = _SAME_SIZE_INT.get(v.element_size())
    if not _compat.DETACH_TRACED_AS_ALIAS or as_int is None or v.is_complex():
        return v.detach()  # complex128 has no integer of its size
    return v.view(as_int).view(v.dtype)


def _masked(mask: torch.Tensor, operands, guarded) -> list:
    """Return ``operands`` unchanged. The backward of those at ``guarded`` reads only
    the examples that ``mask`` selects, with one fused select for all of them."""
    masked = _mask_gradients(mask, [operands[i] for i in guarded])
    inputs = list(operands)
    for i, value in zip(guarded, masked):
        inputs[i] = value
    return inputs
