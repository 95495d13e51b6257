"""The pytree boundary. User branches become flat functions, and flat positions get names.

The operators see flat tuples of tensors only. ``api.py`` flattens the operands,
wraps each branch in a ``FlatBranch`` and rebuilds the output from the ``Outputs``
record that those branches fill in as they run. A number that a branch returns
crosses the operator as a 0-d tensor and is restored here (``numbers.py``). Errors
raised below this layer name flat positions (``CondError.at``). This module names
them from the user's pytrees.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import NoReturn, Protocol

import torch

from .. import _C
from .._compat import pytree
from .._compat.dynamo import raise_at_compile_time
from ..errors import BranchMismatchError, CondArgumentError, CondError, UnsupportedCondError
from . import numbers
from .state import run_branch


class MadeCall(Protocol):
    """A branch's call that already happened (``handoff.Ran``)."""

    def result(self, operands: Sequence) -> object: ...


def describe_structure(spec: pytree.TreeSpec) -> str:
    """Return a short picture of a pytree's shape, such as ``(Tensor, {'h': Tensor})``."""
    marker = object()
    tree = pytree.tree_unflatten([marker] * spec.num_leaves, spec)
    return _render(tree, marker)


def _render(tree, marker) -> str:
    if tree is marker:
        return "Tensor"
    if isinstance(tree, dict):
        items = ", ".join(f"{k!r}: {_render(v, marker)}" for k, v in tree.items())
        return "{" + items + "}"
    if isinstance(tree, list):
        return "[" + ", ".join(_render(v, marker) for v in tree) + "]"
    if isinstance(tree, tuple):
        inner = ", ".join(_render(v, marker) for v in tree)
        return f"({inner},)" if len(tree) == 1 else f"({inner})"
    return repr(tree)


def leaf_paths(spec: pytree.TreeSpec | None, count: int, root: str = "output") -> list[str]:
    """Return ``output[1]['h']``-style names for a flattened pytree's leaves."""
    if spec is None:
        return [f"{root}[{i}]" for i in range(count)]
    tree = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    with_paths, _ = pytree.tree_flatten_with_path(tree)
    # A None in the tree is an output that is not there (see _NoOutput), not a leaf.
    return [root + pytree.keystr(path) for path, leaf in with_paths if leaf is not None]


class _NoOutput:
    """Stands for a ``None`` in a branch's output, as structure rather than a leaf.

    torch's pytree makes ``None`` a leaf, but a conditional's flat outputs hold only
    tensors. As a node with no children, it is checked like any structure. It comes
    back as ``None`` when the output is rebuilt, as in eager mode.
    """


_Tensor = torch.Tensor  # Dynamo reads a module-level name without an alias guard.


pytree.register_pytree_node(_NoOutput, lambda _: ([], None), lambda _values, _context: None)
_NO_OUTPUT = _NoOutput()


_dynamo_compiling = torch.compiler.is_dynamo_compiling
_plain_tensors = _C.plain_tensors
# Branches most often return one tensor, or a tuple or list of tensors. Their specs are
# made once, so flattening such an output is a type test and comparing specs is an
# identity test.
_LEAF = pytree.tree_structure(0)


@functools.cache
def _sequence_spec(kind: type, n: int) -> pytree.TreeSpec:
    return pytree.tree_structure(kind(range(n)))


def flatten_output(out, label: str) -> tuple[list, pytree.TreeSpec]:
    """Return a branch's output as flat tensors and numbers, and its structure. A
    ``None`` is not a leaf. ``label`` names the branch in an error."""
    if not _dynamo_compiling():  # Dynamo would guard on these types, and it cannot trace the cache.
        kind = type(out)
        if kind is _Tensor:
            return [out], _LEAF
        if (kind is tuple or kind is list) and all(type(o) is _Tensor for o in out):
            return list(out), _sequence_spec(tuple if kind is tuple else list, len(out))
    flat, spec = pytree.tree_flatten(
        pytree.tree_map(lambda leaf: _NO_OUTPUT if leaf is None else leaf, out)
    )
    if not all(isinstance(leaf, (torch.Tensor, *numbers.NUMBER_TYPES)) for leaf in flat):
        for path, leaf in zip(leaf_paths(spec, len(flat)), flat):
            if not isinstance(leaf, (torch.Tensor, *numbers.NUMBER_TYPES)):
                raise BranchMismatchError(
                    f"{label} output: every leaf must be a torch.Tensor or a number "
                    f"(int, bool, float or their Sym kinds); {path} is "
                    f"{type(leaf).__name__} ({leaf!r})"
                )
    return flat, spec


def unflatten_output(flat: Sequence, spec: pytree.TreeSpec):
    """Undo ``flatten_output``."""
    if not _dynamo_compiling():
        if spec is _LEAF:
            return flat[0]
        if spec is _sequence_spec(tuple, len(flat)):
            return tuple(flat)
    return pytree.tree_unflatten(list(flat), spec)


def check_same_structure(labels: Sequence[str], specs: Sequence[pytree.TreeSpec]) -> None:
    """Raise ``BranchMismatchError`` unless every branch returned the first one's pytree
    structure. This is ``merge.check_agreement``'s first rule."""
    first = specs[0]
    for label, spec in zip(labels[1:], specs[1:]):
        if spec is not first and spec != first:
            raise BranchMismatchError(
                "branches must return the same pytree structure: "
                f"{labels[0]} returns {describe_structure(first)}, "
                f"{label} returns {describe_structure(spec)}"
            )


class Outputs:
    """The output structure of one conditional call, as its branches return it.

    Every ``FlatBranch`` of the call records into the same ``Outputs``. It checks that
    each branch returns the same structure and leaf kinds (tensor, int, bool, float) as
    the first one. After the operator returns, the boundary reads ``spec`` to rebuild
    the user's output and ``numbers`` to restore the number leaves.
    """

    def __init__(self, number_device: torch.device | None = None):
        # The device on which a number crosses the operator as a 0-d tensor
        # (numbers.carried).
        self.number_device = number_device
        # The first branch's (label, structure, leaf kinds). It lives in a list because
        # dynamo on torch 2.13 loses some attribute writes. After it traces a
        # higher-order operator, such as a branch holding a conditional, it loses a
        # write to an attribute that the object's __init__ set.
        self._first: list[tuple[str, pytree.TreeSpec, tuple[str, ...] | None]] = []
        # Maps each number leaf's flat position to each branch's value there, by label.
        self.numbers: dict[int, dict[str, object]] = {}

    @property
    def spec(self) -> pytree.TreeSpec | None:
        return self._first[0][1] if self._first else None

    def record(self, label: str, spec: pytree.TreeSpec, flat: list) -> None:
        kinds = None
        if not all(type(leaf) is _Tensor for leaf in flat):
            kinds = tuple(numbers.kind(leaf) for leaf in flat)
            for j, leaf in enumerate(flat):
                if kinds[j] != "Tensor":
                    self.numbers.setdefault(j, {})[label] = leaf
        if not self._first:
            self._first.append((label, spec, kinds))
            return
        first_label, first_spec, first_kinds = self._first[0]
        if spec is not first_spec:
            check_same_structure([first_label, label], [first_spec, spec])
        if kinds != first_kinds:
            every = [first_kinds or ("Tensor",) * len(flat), kinds or ("Tensor",) * len(flat)]
            paths = leaf_paths(spec, len(flat))
            numbers.check_same_kinds([first_label, label], every, paths)

    def restored(self, flat_out: Sequence, n_branches: int, selected: bool) -> list:
        """Return the operator's flat outputs with each number leaf restored."""
        flat = list(flat_out)
        if self.numbers:
            paths = leaf_paths(self.spec, len(flat))
            for j, by_label in self.numbers.items():
                values = list(by_label.values())
                flat[j] = numbers.restored(flat[j], values, n_branches, paths[j], selected)
        return flat


class FlatBranch:
    """A user branch that takes flat tensor operands and returns a flat tuple. An
    ``in_spec`` of None means that the operands are already a flat tuple of tensors.
    ``ran`` is this call of the branch where it already happened (handoff.py)."""

    def __init__(
        self,
        fn: Callable,
        in_spec: pytree.TreeSpec | None,
        label: str,
        outputs: Outputs,
        ran: MadeCall | None = None,
    ):
        self.fn = fn
        self.in_spec = in_spec
        self.label = label
        self.outputs = outputs
        self.ran = ran
        self.__name__ = getattr(fn, "__name__", label)

    def __call__(self, *flat_operands):
        if self.in_spec is None:
            operands = flat_operands
        else:
            operands = pytree.tree_unflatten(list(flat_operands), self.in_spec)
        try:
            if self.ran is None:
                out = run_branch(self.fn, self.label, operands)
            else:
                out = self.ran.result(operands)
        except TypeError as error:
            raise_if_arity_error(error, self.fn, self.label, operands)
            raise
        flat, spec = flatten_output(out, self.label)
        self.outputs.record(self.label, spec, flat)
        if self.outputs.numbers:
            paths = leaf_paths(spec, len(flat))
            flat = [
                leaf
                if isinstance(leaf, torch.Tensor)
                else numbers.carried(leaf, paths[j], self.label, self.outputs.number_device)
                for j, leaf in enumerate(flat)
            ]
        return tuple(flat)


def speculated(
    fn: Callable, label: str, in_spec: pytree.TreeSpec | None, leaves_only: bool = False
) -> Callable:
    """Return a user branch as dynamo speculates it into a subgraph. When ``in_spec``
    is given, it takes flat operands and rebuilds the user's pytrees.

    Once the branch is traced, dynamo drops what the branch stored on an object it
    made, such as an instance of a custom pytree node. Only then does dynamo flatten
    the outputs. So this refuses such an output by name. ``leaves_only`` means that
    nobody reads the output's structure, and then the leaves are returned instead.
    Nothing is recorded, because dynamo refuses side effects in a branch.
    """

    def run(*operands):
        if in_spec is not None:
            operands = pytree.tree_unflatten(list(operands), in_spec)
        out = fn(*operands)
        if leaves_only:
            leaves = pytree.tree_leaves(out)
            return tuple(
                numbers.carried(leaf, "a number", label)
                if isinstance(leaf, numbers.NUMBER_TYPES)
                else leaf
                for leaf in leaves
            )
        kind = _object_in(out)
        if kind is not None:
            raise_at_compile_time(
                UnsupportedCondError,
                f"{label} returns a {kind}: under torch.compile a branch returns tensors "
                "in tuples, lists and dicts, not an object it creates (dynamo cannot "
                f"return one from a conditional's branch). Return the {kind}'s tensors "
                "and build it after the call",
            )
        return pytree.tree_map(lambda leaf: numbers.carried_under_dynamo(leaf, label), out)

    return run


def _object_in(tree) -> str | None:
    """Return the type name of the first value in ``tree`` that is not a tensor, a
    number, a string, None, or a tuple, list or dict of those."""
    items: Iterable
    if isinstance(tree, (tuple, list)):
        items = tree
    elif isinstance(tree, dict):
        items = tree.values()
    elif tree is None or isinstance(tree, (_Tensor, bool, int, float, str)):
        return None
    else:
        return type(tree).__name__
    for item in items:
        found = _object_in(item)
        if found is not None:
            return found
    return None


def run_flat(
    labelled_branches,
    operands,
    run: Callable,
    selected: bool = False,
    selector=None,
    ran: Sequence[MadeCall] = (),
) -> object:
    """Call ``run(flat_branches, flat_operands, labels)`` and rebuild the user's output.

    ``selected`` means that every branch runs and a select picks, so numbers stay 0-d
    tensors. A number crosses on the device of a tensor ``selector``. ``ran`` holds
    the calls of the first branches that already happened (handoff.py). A
    ``CondError`` raised below about a flat output or operand comes out naming it as the
    user wrote it (``output[1]['h']``, ``operands[0]['k']``).
    """
    in_spec: pytree.TreeSpec | None
    if not _dynamo_compiling() and _plain_tensors(operands, False):
        flat_operands, in_spec = tuple(operands), None
    else:
        flat, in_spec = pytree.tree_flatten(operands)
        flat_operands = tuple(flat)
    outputs = Outputs(selector.device if isinstance(selector, torch.Tensor) else None)
    labels = [label for _, label in labelled_branches]
    branches = [
        FlatBranch(fn, in_spec, label, outputs, ran[k] if k < len(ran) else None)
        for k, (fn, label) in enumerate(labelled_branches)
    ]
    try:
        flat_out = run(branches, flat_operands, labels)
    except CondError as error:
        raise_named(error, outputs.spec, in_spec, len(flat_operands))
    assert outputs.spec is not None, "run() returned without calling a branch"
    if outputs.numbers:
        try:
            flat_out = outputs.restored(flat_out, len(branches), selected)
        except CondError as error:
            raise_named(error, outputs.spec, in_spec, len(flat_operands))
    return unflatten_output(flat_out, outputs.spec)


def raise_named(
    error: CondError,
    out_spec: pytree.TreeSpec | None,
    in_spec: pytree.TreeSpec | None,
    n_operands: int = 0,
) -> NoReturn:
    """Raise ``error`` with its flat position named from the user's output and operand
    structures. Raise ``error`` itself when it names no position. An ``in_spec`` of
    None means ``n_operands`` operands that are already flat."""
    count = 1 + error.path[1] if error.path else 0
    n_in = in_spec.num_leaves if in_spec is not None else n_operands
    in_names = leaf_paths(in_spec, n_in, root="operands")
    named = error.named(leaf_paths(out_spec, count), in_names)
    if named is error:
        raise error
    raise named.with_traceback(error.__traceback__) from None


def raise_if_arity_error(error: TypeError, fn: Callable, label: str, operands) -> None:
    """Raise a ``CondArgumentError`` naming the branch when ``fn`` cannot take the
    operands at all. Return when the ``TypeError`` came from inside the branch, so
    that the caller lets ``error`` propagate."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # A builtin or C function may have no signature.
        return
    try:
        signature.bind(*operands)
    except TypeError as mismatch:
        n = len(operands)
        raise CondArgumentError(
            f"{label} is called with the {n} operand{'s' if n != 1 else ''} "
            f"(as {label}(*operands)), but its signature {signature} does not take "
            f"them: {mismatch}"
        ) from error


def check_operand_leaves(operands) -> None:
    """Raise unless every leaf of ``operands`` (a tuple or list of pytrees) is a tensor."""
    leaves, _ = pytree.tree_flatten_with_path(operands)
    for path, leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            raise CondArgumentError(
                "argument 'operands': every leaf must be a torch.Tensor; "
                f"operands{pytree.keystr(path)} is {type(leaf).__name__} ({leaf!r})"
            )
