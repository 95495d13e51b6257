"""Structured conditionals for PyTorch. ``cond`` and ``switch`` are higher-order operators."""

from . import (
    _compat,  # noqa: F401  (importing it first checks the torch version)
    _extension,
)

_extension.load()  # checks that torchcond._C was built for this torch, then loads it
from . import passes  # makes torchcond.passes.lower_to_select reachable
from ._src.api import cond, switch
from ._src.ops import cond_op, switch_op
from ._src.select_ops import select, select_n
from ._version import __version__
from .errors import (
    BranchMismatchError,
    BranchMutationError,
    CondArgumentError,
    CondError,
    UnsupportedCondError,
)

__all__ = [
    "BranchMismatchError",
    "BranchMutationError",
    "CondArgumentError",
    "CondError",
    "UnsupportedCondError",
    "__version__",
    "cond",
    "cond_op",
    "passes",
    "select",
    "select_n",
    "switch",
    "switch_op",
]
