"""Structured conditionals for PyTorch: ``cond`` and ``switch`` as higher-order operators."""

from . import (
    _compat,  # noqa: F401  (checks the torch version first)
    _extension,
)

_extension.load()  # torchcond._C, after checking it was built for this torch
from . import passes  # torchcond.passes.lower_to_select
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
