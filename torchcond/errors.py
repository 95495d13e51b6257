"""The one exception family torchcond raises for mistakes a user can make.

Every message names the argument or output path, what was expected and what was
found. Exceptions raised by the user's own branches are never wrapped.
"""

from __future__ import annotations


class CondError(Exception):
    """Base of every error torchcond raises about its arguments or branches."""


class CondArgumentError(CondError, TypeError):
    """An argument of ``cond``/``switch`` has the wrong type, shape or value."""


class BranchMismatchError(CondError, ValueError, RuntimeError):
    """Branches return outputs that cannot be one operator's output.

    Also a ``RuntimeError``, the type of ``torch.cond``'s mismatch errors, so code
    written against ``torch.cond`` catches it.
    """


class BranchMutationError(CondError, RuntimeError):
    """A traced branch writes to one of its inputs (an operand or a closed-over tensor)."""


class UnsupportedCondError(CondError, NotImplementedError):
    """A combination torchcond cannot compute correctly and refuses rather than guess."""
