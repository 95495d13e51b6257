"""Python numbers among a branch's outputs. These are ``int``, ``bool``, ``float`` and
their symbolic kinds (``SymInt``, ``SymBool``, ``SymFloat``).

The operators return tensors only. A number leaf crosses the operator as a 0-d tensor
(``carried``) and comes back as a number (``restored``). Eagerly, the number is the
taken branch's value. In a trace, it is the constant that every branch returns. If
the branches disagree, it is an unbacked symbol whose range covers every branch's
value, and the range is asserted at run time. Sometimes every branch runs and a
select picks each element (``strategy="select"``, or vmap with a per-example
selector). There a number that differs between branches stays a 0-d tensor, as in JAX.
"""

from __future__ import annotations

import collections
import math

import torch

from .. import _compat
from .._compat import pytree
from ..errors import BranchMismatchError, UnsupportedCondError

NUMBER_TYPES = (bool, int, float, torch.SymBool, torch.SymInt, torch.SymFloat)
_KINDS = {
    bool: "bool",
    int: "int",
    float: "float",
    torch.SymBool: "bool",
    torch.SymInt: "int",
    torch.SymFloat: "float",
}
# A bool crosses as an int64 0 or 1. Inductor's post-grad passes (torch 2.13) fail when
# they compare the unbacked SymBool that item() makes from a bool tensor.
_DTYPES = {"bool": torch.int64, "int": torch.int64, "float": torch.float64}


def kind(leaf) -> str:
    """Return ``bool``, ``int`` or ``float`` for a number leaf and ``Tensor`` for a tensor.
    Return the type name of any other leaf."""
    if isinstance(leaf, torch.Tensor):
        return "Tensor"
    found = _KINDS.get(type(leaf))
    return found if found is not None else type(leaf).__name__


def carried(value, path: str, label: str, device: torch.device | None = None) -> torch.Tensor:
    """Return ``value`` as the 0-d tensor that the operator returns in its place. The
    tensor is on ``device``, or on the CPU if ``device`` is None. Callers pass the
    selector's device, because a select takes every value on one device."""
    try:
        return torch.scalar_tensor(value, dtype=_DTYPES[kind(value)], device=device)
    except RuntimeError as error:  # The int does not fit in int64.
        raise UnsupportedCondError(
            f"{label} output: {path} is the int {value!r}, which does not fit in int64, "
            "the widest integer a conditional's output can carry"
        ) from error


def check_same_kinds(labels, kinds, paths) -> None:
    """Raise ``BranchMismatchError`` naming the first output whose leaf kind (tensor,
    int, bool, float) differs between branches."""
    first = kinds[0]
    for label, other in zip(labels[1:], kinds[1:]):
        for path, a, b in zip(paths, first, other):
            if a != b:
                raise BranchMismatchError(
                    f"{path}: branches must return the same kind of value; "
                    f"{labels[0]} returns {_article(a)}, {label} returns {_article(b)}"
                )


def _article(kind_name: str) -> str:
    return f"an {kind_name}" if kind_name[0] in "aeiou" else f"a {kind_name}"


def restored(out: torch.Tensor, values: list, n_branches: int, path: str, selected: bool):
    """Return the conditional's number at ``path``. ``out`` is the operator's 0-d tensor
    for it. ``values`` holds what the branches that ran returned there."""
    if len(values) == n_branches and _all_same(values):
        return values[0]
    is_bool = kind(values[0]) == "bool"
    if selected or _compat.is_vmapped(out):
        return out != 0 if is_bool else out
    if _compat.is_real_tensor(out) and _compat.active_fx_tracer() is None:
        # Eagerly, or under a mode that traces nothing, this is the taken branch's value.
        number = out.item()
        return bool(number) if is_bool else number
    mode = _compat.fake_mode_of([out])
    shape_env = None if mode is None else mode.shape_env
    if shape_env is None:
        shown = ", ".join(repr(v) for v in values)
        raise UnsupportedCondError(
            f"{path}: branches return different numbers ({shown}) where there is no "
            "shape environment for a symbol (tracing without symbolic shapes, or meta "
            "tensors), so no number can depend on the selector; trace with symbolic "
            "shapes (make_fx(..., tracing_mode='symbolic'), torch.export) or return a tensor"
        )
    number = out.item()
    if is_bool:
        _compat.check_in_range(number, 0, 1)
        return number == 1
    if isinstance(number, torch.SymInt):
        ranges = [_compat.sym_range(shape_env, v) for v in values]
        lower = _compat.finite_bound(min(r[0] for r in ranges))
        _compat.check_in_range(number, lower, _compat.finite_bound(max(r[1] for r in ranges)))
    return number


def _all_same(values) -> bool:
    """True when every branch returns the same constant or the same size expression."""
    first = values[0]
    if type(first) in (bool, int, float):
        return all(type(v) is type(first) and _same_constant(v, first) for v in values[1:])
    if isinstance(first, torch.SymInt):
        return all(isinstance(v, torch.SymInt) and _compat.same_size(v, first) for v in values)
    return False


def _same_constant(a, b) -> bool:
    """Equal, and for floats of the same sign too: -0.0 == 0.0, yet 1 / -0.0 differs."""
    return a == b and (type(a) is not float or math.copysign(1.0, a) == math.copysign(1.0, b))


# --- under dynamo -----------------------------------------------------------------------
#
# Dynamo speculates each branch and rebuilds the node's output itself. The Python
# values that the branches returned reach the code after the call only through the
# output's structure. So a number leaf becomes a ``Carried*`` named tuple. It holds the
# 0-d tensor, which is a graph output, and the number itself, which is a constant.
# Dynamo keeps constants out of the graph and puts back the first branch's value. The
# dynamo hook also takes a symbol out of the graph. The hook (``_compat/dynamo.py``)
# replaces that constant with what every branch returned there (``dynamo_info``).
# ``restored_under_dynamo`` then reads it.


# A number leaf under dynamo holds its 0-d tensor and its value. Each kind has its own
# named tuple, so branches that disagree on a kind also disagree on the structure.
# These are named tuples because dynamo drops what a branch stores on an instance of a
# class of its own.
CarriedBool = collections.namedtuple("CarriedBool", ["tensor", "value"])
CarriedInt = collections.namedtuple("CarriedInt", ["tensor", "value"])
CarriedFloat = collections.namedtuple("CarriedFloat", ["tensor", "value"])
_CARRIED = {"bool": CarriedBool, "int": CarriedInt, "float": CarriedFloat}
Carried = (CarriedBool, CarriedInt, CarriedFloat)
_CARRIED_KINDS = {carried_type: name for name, carried_type in _CARRIED.items()}


def carried_under_dynamo(leaf, label: str):
    """Return ``leaf`` as the branch returns it under dynamo. A number becomes a
    ``Carried``."""
    if not isinstance(leaf, NUMBER_TYPES):
        return leaf
    # Dynamo sees a SymInt as an int, so a SymInt uses the int's named tuple. Dynamo
    # refuses a SymFloat among a branch's outputs, so a float's value is None. The hook
    # reads the float from the graph, where the tensor is made from it.
    kind_name = _KINDS[type(leaf)]
    value = None if kind_name == "float" else leaf
    return _CARRIED[kind_name](carried(leaf, "a number", label), value)


def dynamo_info(values: list, shape_env) -> tuple:
    """Return what ``restored_under_dynamo`` needs to know of one number leaf. This is
    ``("same", constant)``, or ``("symbol", lower, upper)``. The bounds are an int's,
    and None where unbounded."""
    if type(values[0]) in (bool, int, float) and _all_same(values):
        return ("same", values[0])
    if not all(type(v) in (int, torch.SymInt) for v in values):  # A float or a bool gets no bounds.
        return ("symbol", None, None)
    ranges = [_compat.sym_range(shape_env, v) for v in values]
    lower = _compat.finite_bound(min(r[0] for r in ranges))
    return ("symbol", lower, _compat.finite_bound(max(r[1] for r in ranges)))


def restored_under_dynamo(out):
    """Restore each ``Carried`` leaf of ``out``, the conditional's output under dynamo.
    Each leaf holds the information that the dynamo hook left in it."""
    return pytree.tree_map(
        lambda leaf: _restored_carried(leaf) if isinstance(leaf, Carried) else leaf,
        out,
        is_leaf=lambda leaf: isinstance(leaf, Carried),
    )


def _restored_carried(carried_leaf):
    info = carried_leaf.value
    if info[0] == "same":
        return info[1]
    if _compat.transforms_active():
        # The number would come from a tensor that the transform wraps. torch.func
        # cannot turn such a tensor into a number while dynamo traces.
        raise UnsupportedCondError(
            "a Python number that differs between branches is not supported under "
            "torch.compile inside a torch.func transform; return it as a tensor"
        )
    number = _compat.local_scalar(carried_leaf.tensor)
    if type(carried_leaf) is CarriedBool:
        _compat.check_in_range(number, 0, 1)
        return number == 1
    if type(carried_leaf) is CarriedInt:
        _compat.check_in_range(number, info[1], info[2])
    return number


def value_positions(spec) -> dict[int, int]:
    """Map the flat position of each ``Carried`` value in an output of structure
    ``spec`` to the flat position of its tensor."""
    if spec is None:
        return {}
    tree = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    found: dict[int, int] = {}
    pytree.tree_map(
        lambda leaf: (
            found.__setitem__(leaf.value, leaf.tensor) if isinstance(leaf, Carried) else None
        ),
        tree,
        is_leaf=lambda leaf: isinstance(leaf, Carried),
    )
    return found


def check_kinds_in_specs(labels, specs) -> None:
    """Raise ``BranchMismatchError`` if the branches' output structures differ only in
    a leaf's kind, such as a ``Carried*`` against a tensor or another kind. This runs
    under dynamo when the structures differ."""
    if any(spec is None for spec in specs):
        return
    kinds, structures, paths = [], [], []
    for spec in specs:
        tree = pytree.tree_unflatten([None] * spec.num_leaves, spec)
        tree = pytree.tree_map(
            lambda leaf: _CARRIED_KINDS.get(type(leaf), "Tensor"),
            tree,
            is_leaf=lambda leaf: isinstance(leaf, Carried),
        )
        with_paths, structure = pytree.tree_flatten_with_path(tree)
        kinds.append([leaf for _, leaf in with_paths])
        structures.append(structure)
        paths = ["output" + pytree.keystr(path) for path, _ in with_paths]
    if all(s == structures[0] for s in structures[1:]):
        check_same_kinds(labels, kinds, paths)
