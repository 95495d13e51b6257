"""The exceptions that torchcond raises for mistakes a user can make.

Every message names the argument or output path, what was expected, and what was
found. torchcond never wraps an exception that the user's own branch raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

# How a flat position reads when no path from the user's pytree names it.
_FLAT_NAMES = {"output": "output[{}]", "operand": "operands (flattened)[{}]"}


class CondError(Exception):
    """Base class of every error that torchcond raises about its arguments or branches.

    Each subclass also derives from the matching built-in exception, so code that
    catches ``TypeError`` or ``ValueError`` keeps working. torchcond never wraps an
    exception that the user's own branch code raises.

    Examples:
        >>> x = torch.ones(3)
        >>> try:
        ...     torchcond.cond(torch.ones(2) > 0, torch.cos, torch.sin, (x,))
        ... except torchcond.CondError as error:
        ...     print(type(error).__name__, isinstance(error, TypeError))
        CondArgumentError True
    """

    # The rules that raise see only flat tuples of outputs and operands. So ``at``
    # keeps the message with a ``{path}`` placeholder (``template``) and the flat
    # position (``path``). The code that flattened the user's pytrees then calls
    # ``named`` to fill in the real path. The class has no ``__init__`` because dynamo
    # constructs these errors when it traces a check, and it cannot trace a custom
    # ``__init__`` on every torch release.
    template: str = ""
    path: tuple[Literal["output", "operand"], int] | None = None

    @classmethod
    def at(cls, kind: Literal["output", "operand"], index: int, message: str):
        """Return an error about flat ``kind`` number ``index``, at ``{path}`` in ``message``."""
        error = cls(message.replace("{path}", _FLAT_NAMES[kind].format(index)))
        error.template, error.path = message, (kind, index)
        return error

    def named(self, outputs: Sequence[str], operands: Sequence[str]):
        """Return this error with its flat position named from the user's pytrees.
        Return ``self`` if it has no position, or an inner conditional already named it."""
        if self.path is None:
            return self
        kind, index = self.path
        names = outputs if kind == "output" else operands
        if index >= len(names):
            return self
        return type(self)(self.template.replace("{path}", names[index]))


class CondArgumentError(CondError, TypeError):
    """Raised when an argument of ``cond`` or ``switch`` has the wrong type, shape or value."""


class BranchMismatchError(CondError, ValueError, RuntimeError):
    """Raised when branches return outputs that cannot be one operator's output.

    It is also a ``RuntimeError``, the type of ``torch.cond``'s mismatch errors, so
    code written against ``torch.cond`` catches it.

    It is raised when the branches are traced, or eagerly with
    ``check_branches=True``. Otherwise eager mode runs only the taken branch and
    cannot compare. The message names the output path.

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
    """Raised when a branch changes outside state in a way that the conditional cannot
    reproduce as a Python ``if`` would.

    A branch may write to operands, module buffers, closed-over tensors and views of
    them in every mode. It may also assign a registered buffer a tensor of the same
    shape, dtype and device, which a trace records as a write into the buffer.

    These are refused before anything is written:

    * a write through one of two operands that share memory, a write to a real
      tensor that a trace on fake tensors holds as a constant, and a change to an
      operand's sizes or strides;
    * when traced, a change of Python state (a list appended to, an attribute set), a
      tensor assigned to an attribute that is not a buffer, and a buffer assigned a
      value that does not fit it;
    * where every branch runs (``strategy="select"``, or ``torch.vmap`` with a
      per-example predicate), a write to a closed-over tensor or to an operand that
      needs a gradient, and any buffer assignment.

    The message names the attribute, object or operand, and the branch.

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
    """Raised for a combination that torchcond cannot compute correctly, so it refuses to guess."""
