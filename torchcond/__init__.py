"""Structured conditionals for PyTorch: ``cond`` and ``switch`` as higher-order operators."""

from . import _compat  # noqa: F401  (checks the torch version first)
from . import _C  # noqa: F401  (loads the torchcond operator library)
from .api import cond, switch
from .errors import (
    BranchMismatchError,
    BranchMutationError,
    CondArgumentError,
    CondError,
    UnsupportedCondError,
)
from .ops import cond_op, switch_op

__all__ = [
    "BranchMismatchError",
    "BranchMutationError",
    "CondArgumentError",
    "CondError",
    "UnsupportedCondError",
    "cond",
    "cond_op",
    "switch",
    "switch_op",
]
__version__ = "0.1.0"
