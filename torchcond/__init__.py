"""Structured conditionals for PyTorch: ``cond`` and ``switch`` as higher-order operators."""

from . import _compat  # noqa: F401  (checks the torch version first)

try:
    from . import _C  # noqa: F401  (loads the torchcond operator library)
except ImportError as e:  # pragma: no cover - depends on how the package was installed
    raise ImportError(
        "torchcond's C++ extension (torchcond._C) is not built for this Python/torch; "
        "build it with `pip install --no-build-isolation -e .` in the repository "
        f"(original error: {e})"
    ) from e
from .api import cond, switch
from .errors import (
    BranchMismatchError,
    BranchMutationError,
    CondArgumentError,
    CondError,
    UnsupportedCondError,
)
from .fused_select import select, select_n
from .ops import cond_op, switch_op
from . import passes  # noqa: E402  (torchcond.passes.lower_to_select)

__all__ = [
    "BranchMismatchError",
    "BranchMutationError",
    "CondArgumentError",
    "CondError",
    "UnsupportedCondError",
    "cond",
    "cond_op",
    "passes",
    "select",
    "select_n",
    "switch",
    "switch_op",
]
__version__ = "0.1.0"
