"""The two conditional kinds, cond and switch, and their selectors.

Both operators are one conditional over N branches, called as
``op(selector, *branches, operands)``. A ``ConditionalKind`` holds everything that
differs between them:

* how a selector is checked, normalized (clamped, for switch) and read;
* which branch a selector takes;
* how branches are labelled in messages;
* how branch graphs are named in a traced module.

The operator takes a selector tensor as the user gave it: one element, any shape, any
allowed dtype. No op between the user's tensor and the operator prepares it, so a
compiled program reads the selector when it runs. (AOTInductor folds an op on a
buffer into a compile-time constant, even when the program writes that buffer.) A rule
reads it with ``taken_index`` on the host or ``branch_indices`` on the device;
Inductor's lowering, the ONNX translation and the graph passes convert it in their own IR.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_false, statically_known_true

from .. import _compat
from ..errors import CondArgumentError


@dataclasses.dataclass(frozen=True, eq=False)
class ConditionalKind:
    """What differs between the two operators, as a table: ``cond_kind`` and
    ``switch_kind`` fill it in.

    A selector here is the user's argument (``normalize``), the operator's selector
    (``taken_index``, ``branch_indices``), or a concrete value read on the host.
    """

    op: Any  # the higher-order operator
    name: str  # the public function's name in messages
    selector_arg: str  # its selector argument's name
    symbolic_kind: str  # for a warning, the selector that keeps every branch in an export
    selector_dtype: torch.dtype  # dtype of a selector tensor made from a symbolic one
    # The branches' names for messages, given their number.
    labels: Callable[[int], list[str]]
    # Check the branches (CondArgumentError) and return them as a list.
    check_branches: Callable[[Any], list]
    # Free attribute names on a root module for one node's n branch graphs.
    graph_names: Callable[[torch.nn.Module, int], list[str]]
    # Whether a value is a Python constant that picks a branch by itself.
    is_constant: Callable[[Any], bool]
    # The branch that a concrete selector (a Python number or a real tensor) takes.
    taken_index: Callable[[Any, int], int]
    # The int64 branch index for each element of a selector tensor, on its device.
    branch_indices: Callable[[torch.Tensor, int], torch.Tensor]
    # Raise CondArgumentError unless the tensor is a valid selector.
    check_tensor: Callable[[torch.Tensor], None]
    # A checked symbolic or tensor selector in the operator's form: a SymBool, a
    # clamped SymInt, or the user's tensor unchanged.
    normalize: Callable[[Any, int], Any]
    # The branch a symbolic selector takes for every input its shape environment admits
    # (``x.shape[0] > 1`` where the size is at least 2), or None.
    known_index: Callable[[Any, int], int | None]
    # What each of the n branches may assume while it is traced: one list of sympy
    # facts per branch, about a symbolic selector (empty lists for a tensor). An
    # optional third argument is the graph node that computed the selector.
    branch_facts: Callable[..., list[list]]

    def constant_taken_index(self, value, n: int) -> int:
        """Return the branch a Python constant takes, or raise ``CondArgumentError``."""
        return self.taken_index(value if self.is_constant(value) else self.normalize(value, n), n)

    def warn_if_exporting(self, value, stacklevel: int = 2) -> None:
        """While exporting, warn that the Python constant ``value`` exports only the
        branch it takes. ``stacklevel`` counts from here, as in ``warnings.warn``, so
        2 names this method's caller."""
        if _compat.is_exporting():
            warnings.warn(
                f"{self.name}: argument '{self.selector_arg}' is the Python constant {value!r}, "
                f"so only the branch it selects is exported. Pass {self.symbolic_kind} to keep "
                "every branch in the graph.",
                UserWarning,
                stacklevel=stacklevel,
            )

    def taken_branch(self, selector, branches: Sequence[Callable]) -> Callable:
        """Return the branch that a concrete selector takes. A Python value that is no
        selector, such as None, raises as it does in ``cond``."""
        n = len(branches)
        if isinstance(selector, torch.Tensor):
            return branches[self.taken_index(selector, n)]
        return branches[self.constant_taken_index(selector, n)]

    def call_below_autograd(self, selector, branches, operands):
        """Call the operator again below the Autograd key, after its autograd rule ran."""
        with _compat.below_autograd():
            return self.op(*pack(selector, branches, operands))


_COND_LABELS = ("true_fn", "false_fn")


def cond_kind(op) -> ConditionalKind:
    return ConditionalKind(
        op,
        "cond",
        "pred",
        "a tensor or a SymBool",
        torch.bool,
        labels=lambda n: list(_COND_LABELS),
        check_branches=_check_cond_branches,
        graph_names=_cond_graph_names,
        is_constant=lambda value: isinstance(value, (bool, int, float)),
        taken_index=lambda pred, n: 0 if pred else 1,
        # True takes branch 0 (true_fn), false branch 1.
        branch_indices=lambda pred, n: (as_scalar(pred) == 0).to(torch.int64),
        check_tensor=check_pred_tensor,
        normalize=lambda pred, n: normalize_pred(pred),
        known_index=_known_pred,
        branch_facts=lambda pred, n, node=None: _compat.cond_facts(pred, node),
    )


def switch_kind(op) -> ConditionalKind:
    return ConditionalKind(
        op,
        "switch",
        "index",
        "a tensor or a SymInt",
        torch.int64,
        labels=switch_labels,
        check_branches=check_branch_list,
        graph_names=_switch_graph_names,
        is_constant=lambda value: isinstance(value, int) and not isinstance(value, bool),
        taken_index=lambda index, n: clamp_index(host_index(index), n),
        branch_indices=lambda index, n: clamped_switch_indices(as_scalar(index), n),
        check_tensor=check_index_tensor,
        normalize=normalize_index,
        known_index=_known_index,
        branch_facts=_compat.switch_facts,
    )


def _known_pred(pred, n: int) -> int | None:
    """The branch a symbolic predicate takes for every size its shape environment
    admits, or None. No guard is added: the environment proves it from the ranges."""
    if isinstance(pred, (torch.SymInt, torch.SymFloat)):
        pred = pred != 0
    if not isinstance(pred, torch.SymBool):
        return None
    if statically_known_true(pred):
        return 0
    if statically_known_false(pred):
        return 1
    return None


def _known_index(index, n: int) -> int | None:
    """The branch a symbolic index takes, clamped, for every size its shape environment
    admits, or None."""
    if not isinstance(index, torch.SymInt):
        return None
    if statically_known_true(index <= 0):
        return 0
    if statically_known_true(index >= n - 1):
        return n - 1
    return next((k for k in range(1, n - 1) if statically_known_true(index == k)), None)


def _check_cond_branches(branches) -> list:
    check_callables(branches, _COND_LABELS)
    return list(branches)


def _cond_graph_names(root: torch.nn.Module, n: int) -> list[str]:
    """Return ``true_graph_i`` and ``false_graph_i`` for the first ``i`` free for both."""
    i = 0
    while hasattr(root, f"true_graph_{i}") or hasattr(root, f"false_graph_{i}"):
        i += 1
    return [f"true_graph_{i}", f"false_graph_{i}"]


def _switch_graph_names(root: torch.nn.Module, n: int) -> list[str]:
    """Return ``branch_graph_i`` for the first ``n`` free values of ``i``."""
    names, i = [], 0
    for _ in range(n):
        while hasattr(root, f"branch_graph_{i}"):
            i += 1
        names.append(f"branch_graph_{i}")
        i += 1
    return names


# --- selectors ------------------------------------------------------------------------
# These are module-level functions because the dynamo entry points in api.py call them.
# Dynamo guards on every global that a traced function reads. So these functions read
# only this module's own names, with no ``torch.X`` chains and no ConditionalKind
# attributes.

_BOOL = torch.bool
_Tensor = torch.Tensor
_SymBool, _SymInt, _SymFloat = torch.SymBool, torch.SymInt, torch.SymFloat
_sym_min, _sym_max = torch.sym_min, torch.sym_max


def normalize_pred(pred):
    """Return a symbolic or tensor predicate in the operator's form: a SymBool, or the
    checked tensor unchanged."""
    if isinstance(pred, _SymBool):
        return pred
    if isinstance(pred, (_SymInt, _SymFloat)):
        return pred != 0
    if not isinstance(pred, _Tensor):
        raise CondArgumentError(
            "cond: argument 'pred' must be a Python bool or number, a SymBool, or a "
            f"tensor with one element; found {type(pred).__name__} ({pred!r})"
        )
    check_pred_tensor(pred)
    return pred


def as_scalar(selector: torch.Tensor) -> torch.Tensor:
    """A one-element selector as a 0-d tensor (a batched one stays batched)."""
    return selector.reshape(()) if selector.dim() else selector


def normalize_index(index, n: int):
    """Return a symbolic or tensor index in the operator's form: a SymInt clamped to
    ``[0, n - 1]``, or the checked tensor unchanged (the rules that read it clamp it).

    Under dynamo, a Python int and a SymInt both look like ints.
    """
    if type(index) is int:  # a size dynamo specialized, say: torch 2.11's dynamo
        return clamp_index(index, n)  # cannot graph a sym_max that gives an int
    if isinstance(index, (_SymInt, int)) and not isinstance(index, bool):
        return _sym_min(_sym_max(index, 0), n - 1)  # clamp_index, kept symbolic
    if not isinstance(index, _Tensor):
        raise CondArgumentError(
            "switch: argument 'index' must be a Python int, a SymInt, or a one-element "
            f"integer tensor; found {type(index).__name__} ({index!r})"
        )
    check_index_tensor(index)
    return index


def check_callables(fns, names) -> None:
    for fn, name in zip(fns, names):
        if not callable(fn):
            raise CondArgumentError(
                f"argument '{name}' must be callable; found {type(fn).__name__} ({fn!r})"
            )


def check_branch_list(branches) -> list:
    """Check switch's ``branches``, a non-empty list or tuple of callables; return a list."""
    if not isinstance(branches, (list, tuple)):
        raise CondArgumentError(
            "switch: argument 'branches' must be a list or tuple of callables; found "
            f"{type(branches).__name__}"
        )
    if not branches:
        raise CondArgumentError(
            "switch: argument 'branches' must hold at least one callable; found an empty sequence"
        )
    check_callables(branches, switch_labels(len(branches)))
    return list(branches)


def switch_labels(n: int) -> list[str]:
    return [f"branches[{i}]" for i in range(n)]


def check_pred_tensor(pred: torch.Tensor) -> None:
    if pred.numel() != 1:
        raise CondArgumentError(
            "cond: argument 'pred' must have exactly one element; found a tensor of "
            f"shape {tuple(pred.shape)} ({pred.numel()} elements)"
        )
    if pred.dtype.is_complex:
        raise CondArgumentError(
            f"cond: argument 'pred' must have a real or bool dtype; found {pred.dtype}"
        )


INTEGER_DTYPES = frozenset(
    getattr(torch, name)
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
)


def check_index_tensor(index: torch.Tensor) -> None:
    if index.dtype not in INTEGER_DTYPES:
        raise CondArgumentError(
            f"switch: argument 'index' must have an integer dtype; found {index.dtype}"
            + (" (use cond for a boolean predicate)" if index.dtype is _BOOL else "")
        )
    if index.numel() != 1:
        raise CondArgumentError(
            "switch: argument 'index' must have exactly one element; found a tensor of "
            f"shape {tuple(index.shape)}"
        )


# --- the switch index rule ----------------------------------------------------------
# An out-of-range index is clamped to [0, n - 1] in every mode. A negative index takes
# the first branch, and a large one takes the last, as in jax.lax.switch. clamp_index
# is the rule for a Python int. Each other index type has its own copy of the rule,
# and each copy names this place:
#   normalize_index         a SymInt. sym_min/sym_max keep the graph symbolic.
#   clamped_switch_indices  a tensor, in every mode. A uint64 past int64 wraps first.
#   csrc/eager.cpp          taken_case, the eager fast path, in C with no Python call.
#   csrc/select_plan.h      clamp_branch, per element in select_n's kernels (CPU, CUDA).
#   _compat/inductor.py     _clamped, in Inductor's IR (a tensor or a sympy expression).
#   _src/to_onnx.py         no clamp. It falls out of the chain of `index < k` tests.


def clamp_index(index: int, n: int) -> int:
    """The branch a concrete index takes (see "the switch index rule" above)."""
    return min(max(index, 0), n - 1)


def host_index(index) -> int:
    """Return a concrete index as a Python int, exact for a uint64 at or above 2**63."""
    return int(index.item()) if isinstance(index, torch.Tensor) else int(index)


_INT64_MAX = torch.iinfo(torch.int64).max


def clamped_switch_indices(index: torch.Tensor, n: int) -> torch.Tensor:
    """Return the index clamped to ``[0, n - 1]`` as int64, in every mode.
    It widens first, because a narrow dtype (uint8, int8) may not hold ``n - 1``.
    A uint64 at or above 2**63 wraps to a negative int64. It is reset to the int64 maximum,
    so it takes the last branch, as on the host and in ``select_n``'s kernel."""
    wide = index.to(torch.int64)
    if index.dtype == torch.uint64:
        wide = torch.where(wide < 0, _INT64_MAX, wide)
    return wide.clamp(0, n - 1)


COND_NAME, SWITCH_NAME = "torchcond_cond", "torchcond_switch"  # the operators' names


def is_conditional_op(op) -> bool:
    """Whether ``op`` is ``torchcond_cond`` or ``torchcond_switch``."""
    return isinstance(op, _compat.HigherOrderOperator) and _compat.hop_name(op) in (
        COND_NAME,
        SWITCH_NAME,
    )


def unpack(args: tuple) -> tuple:
    """``(selector, *branches, operands)`` -> ``(selector, branches, operands)``."""
    return args[0], args[1:-1], args[-1]


def pack(selector, branches: Sequence, operands: tuple) -> tuple:
    return (selector, *branches, operands)


def python_scalar(value):
    """Return a NumPy scalar (np.bool_, np.float32, ...) as the Python number it holds."""
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        return value.item()
    return value
