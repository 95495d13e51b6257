"""Branches that run whether or not they are taken. Their writes are undone and selected.

``strategy="select"`` and vmap with a per-example selector run every branch. They then
pick each output element on the device. A write that a branch makes must land only
where the branch is taken, as under a Python ``if``. ``BranchWrites.run`` runs one
branch under a recorder (``torchcond._C.WriteRecorder`` in csrc/write_recorder.cpp,
which owns the rules), through the runner of branches that run untaken
(``_C.run_untaken``). The recorder classifies every write before it lands:

* A write to a tensor that the branch made needs nothing. It is invisible outside.
* A write to one operand, within its elements, is allowed. The recorder saves the
  operand's old value first. After the branch, it takes the new value and puts the
  old one back, so the next branch sees the old value. The caller selects each
  written operand's value like an output and writes the selection back. Both steps
  are tensor ops, so a trace of the select records them.
* A write to anything else raises ``BranchMutationError``, and none of the branch's
  writes is kept. This covers a tensor that the branch closes over, a buffer, an
  operand that shares memory with another or needs a gradient, and memory around an
  operand.

The recorder hears of the branch's ops through a dispatch-key fallback in C++, above
autograd, torch.func's wrappers and any dispatch mode (tracing, fake tensors, a user's
mode). A branch that writes nothing pays a fraction of a microsecond per op, and a
refused write raises before it lands.

A branch may also change an operand through attributes, which no op shows:
``requires_grad_()``, ``.grad =``, ``.data =`` and its hooks. The recorder holds that
state of each operand the branch receives, puts it back after the branch and refuses
a change.

Under dynamo the branch is traced inline, and nothing is recorded. Instead the select
path has dynamo speculate the branches as the operator's subgraphs first. It refuses a
subgraph that writes to anything from outside it (api._select_path).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .. import _C, _compat
from ..errors import BranchMutationError, UnsupportedCondError
from .closures import StandIns, under_modes

_Tensor = torch.Tensor
_functorch_base = _compat.functorch_base
_is_dynamo_compiling = _compat.is_dynamo_compiling
_transforms_active = _compat.transforms_active
# Whether the recorder's dispatch key is free for it in this process
# (csrc/write_recorder.cpp). A higher-order operator that a branch calls passes over it.
_KEY_FREE = _C.WriteRecorder.available()
if _KEY_FREE:
    _compat.let_higher_order_ops_pass(_C.WriteRecorder.key)
# The state watch's part of a guard for _C.run_untaken: none here. A user's branch
# watches its own state (state.run_branch).
_NO_WATCH = (None, None, None)


# The message for each reason why the recorder refuses a write, by the name that
# csrc/write_recorder.cpp gives it (torchcond._C.WRITE_REFUSALS), and one of this
# module's own ("beside_copy").
_MESSAGES = {
    "outside": "a tensor from outside it (shape {shape}), whose value cannot be selected per "
    "branch: pass it as an operand",
    "shared": "its input {path}, which shares memory with another operand: pass it once",
    "needs_grad": "its input {path}, which needs a gradient: return the new value instead "
    "(x + 1 rather than x.add_(1))",
    "outside_elements": "memory of its input {path}'s storage outside {path} itself (shape "
    "{shape}), whose value cannot be selected per branch: pass what it writes as an operand",
    "beside_copy": "its input {path} as the caller holds it, beside the copy of it the branch "
    "receives (where a gradient may be taken, a branch writes its own copy): write the one it "
    "receives",
    "metadata": "the shape, strides or storage of its input {path}, which cannot be selected "
    "per branch: use the op out of place (x.unsqueeze(0), not x.unsqueeze_(0))",
    "autograd_state": "the state of its input {path} that no op changes (requires_grad, "
    ".grad, hooks or .data), which cannot be selected per branch: change it outside the "
    "conditional",
}
_CODES = {**_C.WRITE_REFUSALS, "beside_copy": max(_C.WRITE_REFUSALS.values()) + 1}
_WHY = {_CODES[name]: text for name, text in _MESSAGES.items()}
_NEEDS_GRAD, _BESIDE_COPY = _CODES["needs_grad"], _CODES["beside_copy"]


class BranchWrites:
    """Records the writes of one conditional call's branches to its ``operands``, one
    branch at a time. Call ``run`` on a branch and then ``finish``, or call ``run_all``
    for all branches. ``refuse_grad[i]`` refuses writes to operand ``i`` because it
    needs a gradient. With ``owning``, branches run with ``run_owning``, and each
    branch writes its own copy of an operand."""

    def __init__(self, operands: Sequence, refuse_grad: Sequence[bool], owning: bool = False):
        self.label = ""
        self._operands = operands
        self._inputs = operands
        self._needs_grad = list(refuse_grad)
        # The recorder stops some writes before they land. It stops a write to an
        # operand that needs a gradient. With ``owning``, it stops every write to an
        # operand, since each branch writes its own copy.
        self._refuse = [
            needs or (owning and isinstance(t, _Tensor)) for needs, t in zip(refuse_grad, operands)
        ]
        self._owning = owning
        # With ``owning``, these are the operands that each branch gets a copy of, from
        # the start, so that no branch runs twice. Only the copies it wrote are new values.
        self._copied: list[int] = (
            [i for i, t in enumerate(operands) if isinstance(t, _Tensor) and not refuse_grad[i]]
            if owning and not _is_dynamo_compiling()
            else []
        )
        # Per run of a branch on copies: each copied operand's memory read through another
        # tensor the branch closes over (``note_closure_read``).
        self._aliases_read: dict[int, torch.Tensor] = {}
        self._wrote = False
        # The last branch's recorder. It is made when a branch runs.
        self._recorder: _C.WriteRecorder | None = None
        # Nothing records writes under dynamo (see the module docstring).
        self._records = not _is_dynamo_compiling()

    @property
    def recorder(self) -> _C.WriteRecorder:
        """The last branch's recorder. It exists once a branch has run."""
        assert self._recorder is not None, "no branch has run"
        return self._recorder

    def _bases(self, operands: Sequence) -> Sequence:
        """Return the tensors under the operands' torch.func wrappers, if any."""
        if not _transforms_active() and _C.plain_tensors(operands, True):
            return operands
        return [_functorch_base(t) if isinstance(t, _Tensor) else None for t in operands]

    def stand_in(self, t: torch.Tensor) -> None:
        """Mark ``t`` as read in place of a tensor from outside the branch. The branch
        made ``t``, but a write to it is a write to the outside."""
        if self._recorder is not None:
            self._recorder.mark_outside(t)

    def run(self, label: str, branch: Callable, inputs: Sequence, mode=None) -> tuple:
        """Return ``tuple(branch(*inputs))`` with its writes recorded, under ``mode`` if
        given. ``inputs`` are the operands as this branch reads them, either stand-ins
        or the operands themselves. Raise ``BranchMutationError`` for a refused write.
        After any error, the operands are as they were."""
        self.label = label
        fn = branch if mode is None else under_modes(branch, mode)
        if not self._records:
            return tuple(fn(*inputs))
        if self._recorder is None:
            if not _KEY_FREE:
                raise UnsupportedCondError(
                    f"{label} runs whether or not it is taken, and torchcond records its "
                    "writes through a dispatch key (DeferredInit) that another library "
                    "registered in this process first; pick the branch on the host "
                    "(strategy='auto' with a predicate the host can read)"
                )
            self._recorder = _C.WriteRecorder(self._bases(inputs), self._refuse)
        elif inputs is not self._inputs:
            self._recorder.rebase(self._bases(inputs))
        self._inputs = inputs
        # The runner holds the autograd state of the operands the branch receives.
        real = [a is o for a, o in zip(inputs, self._operands)]
        ran = _C.run_untaken((fn,), tuple(inputs), (self.recorder, real, *_NO_WATCH), 0)
        if ran.stop < 0:
            self._wrote = False
            return tuple(ran.outputs[0])
        return self._stopped(ran.recorder, ran.error, ran.out)

    def settle(self, label: str, recorder, error, outputs) -> tuple[tuple, dict[int, torch.Tensor]]:
        """``finish`` a branch that ran under ``recorder`` (None: it wrote nothing) and
        stopped ``_C.run_untaken``, with ``outputs`` or its ``error``."""
        self.label = label
        return self.finish(self._stopped(recorder, error, outputs))

    def _stopped(self, recorder, error, outputs) -> tuple:
        """Return the outputs of the branch that stopped ``_C.run_untaken``, with its
        writes saved for ``finish``. Raise, with its writes undone, where it raised or
        a write was refused."""
        self._wrote = recorder is not None
        if recorder is not None:
            self._recorder = recorder
        try:
            if error is not None:
                raise error
            out = tuple(outputs)
        except BaseException as error:
            if self._wrote:
                self._undo_and_raise(error)
            raise
        if self._wrote:  # finish() takes the saved value of a plain write.
            self._undo_and_raise(None)
        return out

    def run_owning(
        self, label: str, branch: Callable, inputs: Sequence, mode: StandIns
    ) -> tuple[tuple, dict[int, torch.Tensor]]:
        """Call ``run`` then ``finish`` for a branch whose autograd graph may keep what it
        writes. This happens when a gradient may be taken, now or of a trace.

        The branch writes its own copy of an operand. The copy's value afterwards is
        the operand's new value. Putting the old value back in place, as ``run`` does,
        would change a tensor that the graph saved. Every branch gets a copy of each
        operand that needs no gradient, so each runs once, traced too. A copy's shape,
        strides and storage are refused as an operand's are.

        ``mode`` is how the branch reads the tensors it closes over. Through it, the
        branch reads its copy where it reads an operand that it was given a copy of."""
        copied = self._copied
        self._aliases_read = {}

        def read_copy(i: int, copy: torch.Tensor) -> None:
            mode.read_as(self._operands[i], copy)
            mode.read_as(inputs[i], copy)
            if self._recorder is not None:
                self._recorder.copy_of(i, copy)

        out = self.run(label, _writing_copies(branch, copied, read_copy), inputs, mode)
        n = len(out) - len(copied)
        # The recorder heard of each write to a copy (none under dynamo).
        written = set(self._recorder.copies_written) if self._recorder is not None else set()
        self._refuse_stale_reads(written)
        outputs, values = self.finish(out[:n])
        for i, copy in zip(copied, out[n:]):
            if i in written:
                values[i] = copy
            else:  # Unwritten, so an output that is the copy is the operand.
                outputs = tuple(inputs[i] if o is copy else o for o in outputs)
        return outputs, values

    def note_closure_read(self, t: torch.Tensor) -> None:
        """Note a tensor the branch closes over that shares memory with an operand it
        writes a copy of, though it is not the operand itself."""
        for i in self._copied:
            if self._operands[i] is not t and shares_storage(t, self._operands[i]):
                self._aliases_read[i] = t

    def _refuse_stale_reads(self, written: set[int]) -> None:
        """Refuse a branch that wrote its copy of an operand and read the operand's memory
        through another tensor it closes over. That tensor still shows the old values."""
        for i in written:
            if i in self._aliases_read:
                shape = tuple(self._aliases_read[i].shape)
                raise BranchMutationError.at(
                    "operand",
                    i,
                    f"{self.label} writes in place to {{path}} and reads its memory through "
                    f"a tensor of shape {shape} that it closes over. Every branch runs "
                    "here (strategy='select', or vmap with a per-example selector), and "
                    "while a gradient may be taken each writes its own copy of {path}, "
                    "which that tensor does not show. Read {path} itself, or make the "
                    "view inside the branch",
                )

    def run_all(self, labels: Sequence[str], branches: Sequence[Callable], inputs) -> tuple:
        """Run and finish each branch on ``inputs``, without a context. Return every
        branch's outputs and, for each branch, the new operand values that it wrote."""
        done = [self.finish(self.run(label, b, inputs)) for label, b in zip(labels, branches)]
        return [outs for outs, _ in done], [values for _, values in done]

    def _undo_and_raise(self, error: BaseException | None) -> None:
        """Undo every write of the branch after an ``error`` or a refused write. Then raise
        the refusal from ``error``, or return so that the caller raises ``error``. With
        neither, the recorder saved a write for finish(), so just return."""
        recorder = self.recorder
        refusal = recorder.refusal
        if error is None and refusal is None:
            return
        recorder.undo()
        if refusal is not None and self._owning and refusal[3] == _NEEDS_GRAD:
            if not self._needs_grad[refusal[0]]:  # the branch writes its own copy of it
                raise self.refused(*refusal[:3], _BESIDE_COPY) from error
        if refusal is not None and not isinstance(error, BranchMutationError):
            raise self.refused(*refusal) from error

    def refused(self, operand: int, op: str, shape: list, why: int) -> BranchMutationError:
        return refusal_error(self.label, (operand, op, shape, why))

    def finish(self, outputs: tuple) -> tuple[tuple, dict[int, torch.Tensor]]:
        """Return the last branch's outputs and copies of the new values of the operands
        it wrote to (``take_writes``)."""
        if not self._wrote:
            return outputs, {}
        return take_writes(self.recorder, self._inputs, outputs)


def refusal_error(label: str, refusal: tuple[int, str, list, int]) -> BranchMutationError:
    """The error for a write that the recorder refused, as ``recorder.refusal`` gives it."""
    operand, op, shape, why = refusal
    what = _WHY[why].format(shape=tuple(shape), path="{path}")
    message = (
        f"{label} writes in place ({op}) to {what}. Every branch runs here, taken "
        "or not (strategy='select', or vmap with a per-example selector), and each "
        "written operand's value is selected like an output"
    )
    if operand >= 0 and why != _CODES["outside"]:
        return BranchMutationError.at("operand", operand, message)
    return BranchMutationError(message)


def take_writes(
    recorder: _C.WriteRecorder, inputs: Sequence, outputs: Sequence
) -> tuple[tuple, dict[int, torch.Tensor]]:
    """Return a branch's ``outputs`` and copies of the new values of the operands it
    wrote to, as ``recorder`` saved them. The operands then hold their old values again.
    An output that shares memory with a written operand is copied first, since
    ``x.add_(1)`` returns ``x``."""
    saved = recorder.saved
    written = {_storage_id(inputs[i]) for i, _ in saved}
    outputs = tuple(
        o.clone() if isinstance(o, torch.Tensor) and _storage_id(o) in written else o
        for o in outputs
    )
    values = {i: inputs[i].clone() for i, _ in sorted(saved, key=lambda s: s[0])}
    recorder.undo()
    return outputs, values


def _writing_copies(
    branch: Callable, copied: Sequence[int], read_copy: Callable[[int, torch.Tensor], None]
) -> Callable:
    """Return ``branch`` running on a copy of each operand at ``copied``. The copies are
    made while it runs, so its writes to them are its own. ``read_copy(i, copy)`` hears
    of each copy before the branch runs. It returns its outputs and then the copies."""
    if not copied:
        return branch

    def run(*operands):
        inputs = list(operands)
        with _compat.torch_function_disabled():  # a copy of what the branch is given
            for i in copied:
                inputs[i] = inputs[i].clone()
        for i in copied:
            read_copy(i, inputs[i])
        return (*branch(*inputs), *(inputs[i] for i in copied))

    return run


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when the tensors under the functorch wrappers of ``a`` and ``b`` share a
    storage. A tensor without one (sparse, some subclasses) shares none. No torch
    function mode sees the check: an enclosing branch's ``StandIns`` would take the
    unwrapped tensors for tensors that branch reads."""
    a, b = _functorch_base(a), _functorch_base(b)
    if a.layout != torch.strided or b.layout != torch.strided:
        return False
    try:
        with _compat.torch_function_disabled():
            return _compat.same_storage(a, b)
    except (RuntimeError, NotImplementedError):
        return False


def needs_grad(t: torch.Tensor) -> bool:
    """True for a floating tensor that autograd or a torch.func transform differentiates."""
    if not (t.dtype.is_floating_point or t.dtype.is_complex):
        return False
    if _compat.is_dynamo_compiling():  # Dynamo sees no functorch wrappers.
        return (
            torch.is_grad_enabled() and t.requires_grad
        ) or _compat.differentiating_transforms_active()
    if _compat.is_differentiated_by_transform(t):
        return True
    # Under vmap, autograd records below the batched wrapper, which never requires grad.
    return torch.is_grad_enabled() and _compat.functorch_base(t).requires_grad


def _storage_id(t: torch.Tensor):
    # Under vmap the branch sees batched wrappers, but the storage is the batch's.
    return _compat.storage_key(_compat.functorch_base(t))
