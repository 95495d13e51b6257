"""The one exception family torchcond raises for mistakes a user can make.

Every message names the argument or output path, what was expected and what was
found. Exceptions raised by the user's own branches are never wrapped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

# How a flat position is written when nobody names it from the user's pytree.
_FLAT_NAMES = {"output": "output[{}]", "operand": "operands (flattened)[{}]"}


class CondError(Exception):
    """Base of every error torchcond raises about its arguments or branches.

    Each subclass also derives from the matching built-in exception, so code that
    catches ``TypeError`` or ``ValueError`` keeps working. Exceptions raised by the
    user's own branch code are never wrapped in it.

    Examples:
        >>> x = torch.ones(3)
        >>> try:
        ...     torchcond.cond(torch.ones(2) > 0, torch.cos, torch.sin, (x,))
        ... except torchcond.CondError as error:
        ...     print(type(error).__name__, isinstance(error, TypeError))
        CondArgumentError True
    """

    # An error about one flat output or operand (``at``) keeps its message with
    # ``{path}`` for the position (``template``) and the position (``path``): the
    # rules that raise see flat tuples; the boundary that flattened the user's pytrees
    # names the position (``named``). No ``__init__``: dynamo constructs these errors
    # when it traces a check, and cannot trace one on every torch release.
    template: str = ""
    path: tuple[Literal["output", "operand"], int] | None = None

    @classmethod
    def at(cls, kind: Literal["output", "operand"], index: int, message: str):
        """An error about flat ``kind`` number ``index``; ``message`` says ``{path}`` for it."""
        error = cls(message.replace("{path}", _FLAT_NAMES[kind].format(index)))
        error.template, error.path = message, (kind, index)
        return error

    def named(self, outputs: Sequence[str], operands: Sequence[str]):
        """This error with its flat position named from the user's pytrees, or itself
        when it names none (or was already named by an inner conditional)."""
        if self.path is None:
            return self
        kind, index = self.path
        names = outputs if kind == "output" else operands
        if index >= len(names):
            return self
        return type(self)(self.template.replace("{path}", names[index]))


class CondArgumentError(CondError, TypeError):
    """An argument of ``cond``/``switch`` has the wrong type, shape or value."""


class BranchMismatchError(CondError, ValueError, RuntimeError):
    """Branches return outputs that cannot be one operator's output.

    Also a ``RuntimeError``, the type of ``torch.cond``'s mismatch errors, so code
    written against ``torch.cond`` catches it.

    Raised when the branches are traced (eagerly only the taken branch runs), or
    eagerly with ``check_branches=True``. The message names the output path.

    Examples:
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> def f(x):
        ...     return torchcond.cond(x.sum() > 0, lambda x: (x, x), lambda x: {"a": x}, (x,))
        >>> make_fx(f, tracing_mode="symbolic")(torch.ones(3))
        Traceback (most recent call last):
        ...
        torchcond.errors.BranchMismatchError: branches must return the same pytree structure: ...
    """


class BranchMutationError(CondError, RuntimeError):
    """A branch changes something outside itself that the conditional cannot change as
    a Python ``if`` would.

    Writes to operands, module buffers, closed-over tensors and views of them are
    fine in every mode, and so is assigning a registered buffer a tensor of its
    shape, dtype and device (traced, a write into the buffer). Refused, before
    anything is written: a write through one of two operands that share memory, to
    a real tensor a trace on fake tensors holds as a constant, to an operand's sizes
    or strides; when traced, a change of Python state (a list appended to, an
    attribute set), a tensor assigned to an attribute that is no buffer, a buffer
    assigned a value that does not fit it; and where every branch runs
    (``strategy="select"``, or ``torch.vmap`` with a per-example predicate), a write
    to a closed-over tensor or an operand that needs a gradient, or an assigned
    buffer. The message names the attribute, object or operand and the branch.

    Examples:
        >>> counter = torch.zeros(())
        >>> def inc(x):
        ...     return x + counter.add_(1)
        >>> x = torch.ones(3)
        >>> torchcond.cond(torch.tensor(False), inc, torch.neg, (x,), strategy="select")
        Traceback (most recent call last):
        ...
        torchcond.errors.BranchMutationError: true_fn writes in place (aten.add_.Tensor) ...
    """


class UnsupportedCondError(CondError, NotImplementedError):
    """A combination torchcond cannot compute correctly and refuses rather than guess."""
