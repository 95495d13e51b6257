"""What a branch may change outside itself, and how a traced conditional carries it.

Eagerly, a conditional is a Python ``if``, so a branch may change anything. In a
trace, every branch runs once while the trace is made, and the program only replays
tensor operations. So:

* A registered buffer that the branch assigns (``self.ema = self.ema * 0.9 + x``,
  ``self.steps += 1``) becomes a write of the new value into the buffer. The
  conditional carries that write as it carries ``add_``/``copy_``. Only the taken
  branch's value lands, on every call. The new value must fit the buffer in shape,
  dtype and device.
* Anything else that a traced program cannot replay raises a ``BranchMutationError``
  that names the attribute or object and the branch. Examples are a tensor attribute
  that is not a buffer, a rebound parameter, a list the branch appends to, an int
  attribute it sets, and ``w.requires_grad_()`` on a tensor it closes over.

Under dynamo (``torch.compile``, strict export) the changes are dynamo's side
effects. ``_compat/dynamo.py`` settles them with the rules below. Where a branch is
traced as Python (``make_fx``, non-strict export), ``run_branch`` watches it. It puts
a buffer's binding back and writes the new value into the buffer, in the trace. It
compares the state of the modules, containers and variables that the branch reaches
before and after the branch runs, and the autograd state of the tensors they hold.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .. import _C, _compat
from ..errors import BranchMutationError

# --- the rules, shared by every way a branch is traced -------------------------------


def _tensor_text(t) -> str:
    shape = tuple(t.shape)
    return f"a tensor of shape {shape}, {t.dtype}, on {t.device}"


def _found_text(value) -> str:
    if isinstance(value, torch.Tensor):
        return _tensor_text(value)
    if value is None:
        return "None"
    return f"{type(value).__name__} ({value!r})" if _short(value) else type(value).__name__


def _short(value) -> bool:
    return isinstance(value, (bool, int, float, str)) and len(repr(value)) <= 40


_REPLAY = (
    "every branch runs here, taken or not (a traced conditional while it is traced, "
    "strategy='select' and vmap with a per-example predicate on every call), and only "
    "tensor operations are replayed or selected"
)


def check_buffer_value(label: str, attr: str, buffer, value) -> None:
    """Raise unless ``value``, assigned to the buffer ``attr``, can be written into
    ``buffer``. It must be a tensor of the same shape, dtype and device."""
    if isinstance(value, torch.Tensor) and (
        value.dtype == buffer.dtype
        and value.device == buffer.device
        and value.dim() == buffer.dim()
        and all(statically_known_true(a == b) for a, b in zip(value.shape, buffer.shape))
    ):
        return
    raise BranchMutationError(
        f"{label} assigns {_found_text(value)} to the buffer {attr}, which is "
        f"{_tensor_text(buffer)}: {_REPLAY}, so the assignment becomes a write of the "
        "taken branch's value into the buffer, which needs the same shape, dtype and "
        f"device. Assign a value that fits (or write into {attr} in place), or return "
        "the value from the branch and assign it after the call"
    )


def refuse_attribute(label: str, attr: str, value) -> NoReturn:
    """Raise for a branch that sets ``attr`` (``self.n``), which is no registered buffer."""
    if isinstance(value, torch.Tensor):
        raise BranchMutationError(
            f"{label} assigns {_found_text(value)} to {attr}, which is not a registered "
            f"buffer or parameter: {_REPLAY}, and it carries a module's tensor state "
            f"through its buffers. Register {attr} as a buffer (register_buffer), so "
            "that assigning it writes the taken branch's value into it, write into an "
            "existing buffer in place, or return the value from the branch and assign "
            "it after the call"
        )
    raise BranchMutationError(
        f"{label} sets {attr} to {_found_text(value)}: {_REPLAY}, so it cannot set "
        "Python attributes as only the taken branch would. Keep the state in a "
        "registered buffer (a tensor the branch assigns or writes in place), or return "
        f"a value from the branch and set {attr} after the call"
    )


def refuse_variable(label: str, name: str, value) -> NoReturn:
    """Raise for a branch that rebinds ``name``, a variable it closes over or a global."""
    fix = (
        f"write into {name} in place ({name}.copy_(...)), which the conditional carries"
        if isinstance(value, torch.Tensor)
        else "keep the state in a registered buffer"
    )
    raise BranchMutationError(
        f"{label} sets {name}, a variable outside it, to {_found_text(value)}: {_REPLAY}, "
        f"so it cannot rebind variables as only the taken branch would. Instead {fix}, "
        f"or return the value from the branch and set {name} after the call"
    )


def refuse_autograd_state(
    label: str, what: str, tensor: torch.Tensor, name: str | None
) -> NoReturn:
    """Raise for a branch that changes, by ``what`` (``requires_grad_``, ``.data =``),
    the autograd state of ``tensor``, from outside the branch. ``name`` is how the
    branch names it (``w``, ``self.lin.weight``), or None where no name is known."""
    subject = (
        f"{name}, a tensor outside it," if name else f"{_tensor_text(tensor)}, from outside it,"
    )
    raise BranchMutationError(
        f"{label} changes {subject} through {what}: {_REPLAY}, and no op carries "
        "requires_grad, .grad, hooks or .data, so the change cannot land only where "
        f"{label} is taken. Change {name or 'it'} outside the conditional"
    )


def refuse_parameter(label: str, attr: str) -> NoReturn:
    raise BranchMutationError(
        f"{label} assigns the parameter {attr}: {_REPLAY}, and a program cannot make a "
        f"new parameter. Write into {attr} in place under torch.no_grad() "
        f"({attr}.copy_(...)), or return the value from the branch"
    )


def refuse_registration(label: str, attr: str, what: str) -> NoReturn:
    """Raise for a branch that adds or removes a buffer, parameter or submodule."""
    raise BranchMutationError(
        f"{label} {what} {attr}: {_REPLAY}, and a program cannot change which buffers, "
        "parameters and submodules a module has. Register it before the call (in "
        "__init__), and assign or write into it in the branch"
    )


_REGISTERED = {"_parameters": "parameter", "_buffers": "buffer", "_modules": "submodule"}


def check_registry_change(
    label: str, attr: str, registry: str, old, new, under_select: bool
) -> None:
    """The one rule for a branch that changes what a module registers as ``attr``:
    ``registry`` is ``"_parameters"``, ``"_buffers"`` or ``"_modules"``, and ``old`` and
    ``new`` are the values before and after, ``ABSENT`` where there is none (an old
    None counts as none). Only a buffer assigned a value that fits, in a branch that
    runs only when taken, becomes a write (``check_buffer_value``). Anything else raises."""
    kind = _REGISTERED[registry]
    if old is ABSENT or old is None:
        refuse_registration(label, attr, f"registers a new {kind}")
    if new is ABSENT:
        refuse_registration(label, attr, f"removes the {kind}")
    if kind == "parameter":
        refuse_parameter(label, attr)
    if kind == "submodule":
        refuse_registration(label, attr, "assigns the submodule")
    check_buffer_value(label, attr, old, new)
    if under_select:
        refuse_under_select(label, attr)


def refuse_python_state(label: str, what: str | None, kind: str) -> NoReturn:
    """Raise for a branch that changes ``what`` in a way that no traced program replays.
    ``what`` is a name such as ``self.log``, or None. ``kind`` is a type such as ``list``."""
    thing = f"{what} (a {kind})" if what is not None else f"a {kind} from outside it"
    later = what if what is not None else "it"
    raise BranchMutationError(
        f"{label} changes {thing}: {_REPLAY}, so the change would happen whether or not "
        f"{label} is taken, and not as the program runs. Keep the state in a "
        "registered buffer (a tensor the branch assigns or writes in place), or return "
        f"a value from the branch and update {later} after the call"
    )


def refuse_deletion(label: str, attr: str) -> NoReturn:
    raise BranchMutationError(
        f"{label} deletes {attr}: {_REPLAY}, so it cannot delete attributes or variables "
        f"as only the taken branch would. Return a value from the branch and delete {attr} "
        "after the call"
    )


def refuse_under_select(label: str, attr: str) -> NoReturn:
    """Raise for a buffer assigned in a branch that runs whether or not it is taken."""
    raise BranchMutationError(
        f"{label} assigns the buffer {attr} in a branch that runs whether or not it is "
        "taken (strategy='select', or vmap with a per-example predicate), where a write "
        "outside the branch has no value to select. Return the value from the branch "
        "and assign it after the call"
    )


# --- branches traced as Python: make_fx, non-strict export ---------------------------

# Set while the branches of a conditional run whether or not they are taken. The value
# is "trace" (make_fx, non-strict export, fake and meta tensors) or "select" (the
# branches run for real and a select picks their outputs). It is set only through
# ``every_branch_runs``, by the rules that run every branch (tracing.trace_branches,
# ops.py's fake and meta rules, strategies.run_every_branch), and read only by
# ``run_branch``: the rules run branches wrapped (``Mapped``, ``logical_sizes``), so
# only the user's branch (``pytrees.FlatBranch``) can watch itself. The one-call paths
# in C++ watch the branches they call themselves.
_EVERY_BRANCH: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "torchcond_every_branch", default=None
)


class every_branch_runs:  # A context manager, so it has a function-style name.
    """Wraps code that runs every branch of a conditional, taken or not. ``run_branch``
    watches the user's branches that run inside it.

    It does nothing under dynamo, which cannot set a context variable. Dynamo has
    already speculated the branches (api's select path) and settled what they change
    (_compat/dynamo.py). It is a class, not a generator, because the select path
    enters it on every call, where a generator's cost shows."""

    __slots__ = ("how", "token")

    def __init__(self, how: str = "trace"):
        self.how = how

    def __enter__(self) -> None:
        self.token = None if _compat.is_dynamo_compiling() else _EVERY_BRANCH.set(self.how)

    def __exit__(self, *exc) -> None:
        if self.token is not None:
            _EVERY_BRANCH.reset(self.token)


def run_branch(fn: Callable, label: str, operands) -> object:
    """Return ``fn(*operands)`` for a user's branch ``fn``. When every branch runs, a
    buffer that ``fn`` assigns keeps its binding and takes the new value in place, in
    the trace if there is one. Anything else that ``fn`` changes outside what it
    reaches is put back and refused (``_reachable`` says how far it reaches)."""
    if _compat.is_dynamo_compiling():  # Dynamo settles changes (every_branch_runs).
        return fn(*operands)
    how = _EVERY_BRANCH.get()
    if how is None:
        return fn(*operands)
    found = _watched(fn, label)
    ran = _C.run_untaken((fn,), tuple(operands), (None, None, (found,), *_WORLD), 0)
    if ran.stop < 0:
        return ran.outputs[0]
    watch_after(found, label, ran.assigned, ran.error is not None, how == "select")
    if ran.error is not None:
        raise ran.error
    return ran.out


_MISSING = object()
# What check_registry_change takes for a value that is not there.
ABSENT = _MISSING


# Probe kinds for what a branch can reach (torchcond._C.watch_snapshot, csrc/watch.cpp).
# A probe is a tuple (kind, object[, key]). What it reads is compared by identity.
_ATTR, _ITEM, _CELL, _DICT, _LIST, _SET, _TYPE, _TENSOR = (
    _C.WATCH_PROBES[name]
    for name in ("attr", "item", "cell", "dict", "list", "set", "type", "tensor")
)


def _contents_probe(value) -> tuple | None:
    """Return the probe of a list, dict or set's contents (``_same_contents``), or None."""
    if isinstance(value, dict):
        return (_DICT, value)
    if isinstance(value, list):
        return (_LIST, value)
    if isinstance(value, set):
        return (_SET, value)
    return None


# What was found about each plain function (``_Found``), kept while the function lives.
# The table holds each function weakly, so dropping the function drops its record, and
# nothing is stored on the function itself. A record never holds its own function, or
# the function would live as long as this table. ``_found`` keeps no record that does.
_RECORDS: weakref.WeakKeyDictionary[types.FunctionType, _Found] = weakref.WeakKeyDictionary()


class _Found:
    """What a branch ``fn`` can reach (``_reachable``), with a snapshot of its probes.
    The probes cover everything read to find what it reaches. ``roles`` says, for the
    probes of what a branch may not change, what a change there is. While every probe
    reads as it did, a new search would find the same."""

    __slots__ = ("iterators", "probes", "roles", "root", "snapshot", "valid")

    def __init__(self, fn: Callable):
        self.probes: list[tuple] = []
        finder = _reachable(fn, self.probes)
        self.roles = finder.roles
        # (name, iterator) for each iterator it reaches, which no snapshot can watch.
        self.iterators = finder.iterators
        self.snapshot = _C.watch_snapshot(self.probes)
        # The function's own attributes are compared here, not probed. A probe would
        # hold the function, which a kept record may not do (_RECORDS).
        self.root = _root_attributes(fn) if type(fn) is types.FunctionType else None
        self.valid = True

    def unchanged(self) -> bool:
        """True when every probe reads as it did. It is never true when anything that a
        role watches differs. It may be false when nothing does."""
        return _C.watch_same(self.probes, self.snapshot)

    def fits(self, fn: types.FunctionType) -> bool:
        root = self.root
        return (
            self.valid
            and root is not None
            and fn.__code__ is root[0]
            and fn.__defaults__ is root[1]
            and fn.__kwdefaults__ is root[2]
            and fn.__module__ is root[3]
            and self.unchanged()
        )


def _root_attributes(fn: types.FunctionType) -> tuple:
    """Return what ``_reachable`` reads of ``fn`` itself, for ``fits`` to compare."""
    return (fn.__code__, fn.__defaults__, fn.__kwdefaults__, fn.__module__)


def _found(fn: Callable) -> _Found:
    """Return what ``fn`` reaches. Reuse the last record if nothing it came from changed.

    Only plain functions keep records, since callers make bound methods and partials
    anew. A record that holds ``fn`` is not kept, or the table would keep ``fn`` alive
    forever. This happens when a branch reaches itself, say through a global or a
    cell. A record that holds ``fn`` raises ``fn``'s reference count, so the count
    shows whether it does. The walk adds a probe of ``fn`` wherever it meets ``fn``
    again. So a path through objects that held ``fn`` before also counts."""
    if type(fn) is not types.FunctionType:
        return _Found(fn)
    found = _RECORDS.get(fn)
    if found is not None and found.fits(fn):
        return found
    count = sys.getrefcount(fn)
    found = _Found(fn)
    if sys.getrefcount(fn) == count:
        _RECORDS[fn] = found
    else:
        _RECORDS.pop(fn, None)
    return found


def _watched(fn: Callable, label: str) -> _Found:
    """Return what ``fn`` reaches, before it runs as if untaken. Refuse it if it reaches
    an iterator, whose position no snapshot can put back."""
    found = _found(fn)
    if found.iterators:
        name, value = found.iterators[0]
        raise BranchMutationError(
            f"{label} reaches {name}, an iterator ({type(value).__name__}), and would "
            f"advance it: {_REPLAY}, and an iterator's position can be neither compared "
            f"nor put back. Draw from {name} before the call and pass the value as an "
            "operand, or keep a count in a registered buffer"
        )
    return found


def watch_after(
    found: _Found, label: str, assigned: list, failed: bool, under_select: bool
) -> None:
    """Settle the state of a branch that ran under ``found``'s watch
    (``_C.run_untaken``): put back what it changed, and refuse the change unless it
    ``failed`` (raised). ``assigned`` holds ``(module, name, buffer before)`` for each
    buffer it assigned. Each becomes a write of the new value into the buffer before,
    unless ``under_select`` (``check_registry_change``)."""
    # (id(module), name) -> (module, name, the buffer before the branch, or _MISSING)
    buffers: dict[tuple[int, str], tuple[torch.nn.Module, str, Any]] = {}
    for module, name, old in assigned:
        buffers.setdefault((id(module), name), (module, name, old))
    if not buffers and found.unchanged():
        return  # Most often, the branch changed nothing that it can reach.
    found.valid = False  # The next call finds what it reaches anew.
    changed = [
        (role, found.probes[i], found.snapshot[i])
        for i, role in found.roles.items()
        if not _C.watch_same([found.probes[i]], [found.snapshot[i]])
    ]
    for role, probe, before in changed:
        if role[0] == _REGISTRY and role[3] == "_buffers":  # rebound without the hook
            module, old = role[2], _pairs(before)
            for name in _differing(old, probe[1]):
                buffers.setdefault((id(module), name), (module, name, old.get(name, _MISSING)))
    writes, error = [], None
    if not failed:
        try:
            writes = _buffer_writes(found, label, buffers, under_select)
            for role, probe, before in changed:
                _refuse_change(role, probe, before, label)
        except BranchMutationError as refused:
            error = refused
    for module, name, old in buffers.values():
        if old is _MISSING:
            _compat.module_buffers(module).pop(name, None)
        else:
            _compat.module_buffers(module)[name] = old
    for role, probe, before in changed:
        _put_back(role, probe, before)
    if error is not None:
        raise error
    for buffer, value in writes:
        buffer.copy_(value)


def _buffer_writes(found: _Found, label: str, buffers: dict, under_select: bool) -> list:
    """Return ``(buffer, new value)`` for each buffer in ``buffers`` the branch rebound."""
    writes = []
    texts = {id(r[2]): r[1] for r in found.roles.values() if r[0] == _REGISTRY}
    for module, name, old in buffers.values():
        new = _compat.module_buffers(module).get(name, _MISSING)
        if new is not old:
            attr = f"{texts.get(id(module), type(module).__name__)}.{name}"
            check_registry_change(label, attr, "_buffers", old, new, under_select)
            writes.append((old, new))
    return writes


# What the runner's buffer hook needs (csrc/write_recorder.cpp): torch's hooks, and what
# it records for a buffer that was not there.
_WORLD = (_compat.BUFFER_REGISTRATION_HOOKS, _MISSING)
# What the eager one-call paths in C++ read and call (OneCall in csrc/batching.cpp),
# passed with each call (api.py adds the eager context).
ONE_CALL = (_watched, *_WORLD, _compat.current_functorch_level)


# A module's own bookkeeping in its __dict__ (hooks, registries, ``training``). It is
# not state that a branch sets.
_BOOKKEEPING = frozenset(torch.nn.Module().__dict__) | {"_initialize_hook", "_load_hook"}
_REGISTRIES = _compat.MODULE_REGISTRIES
_CONTAINERS = (list, dict, set)


# What a change at a probe is (``_Found.roles``, by the probe's index): a role is
# (what, how the branch names it) and, for attributes and registries, their owner
# (and the registry's name).
_ATTRIBUTES, _REGISTRY, _CONTENTS, _VARIABLE, _AUTOGRAD = range(5)


def _pairs(snapshot: tuple) -> dict:
    """The dict a ``_DICT`` probe's snapshot (keys and values, in turn) holds."""
    return dict(zip(snapshot[::2], snapshot[1::2]))


def _differing(before: dict, now: dict) -> list:
    """The keys whose values differ between two dicts, by identity."""
    keys = [*before, *(k for k in now if k not in before)]
    return [k for k in keys if now.get(k, _MISSING) is not before.get(k, _MISSING)]


def _attributes(owner, attrs: dict) -> dict:
    """The attributes among ``attrs`` (``vars(owner)`` or its snapshot) that a branch
    may not set. A module's bookkeeping is left out, and so are the private attributes
    of torch's own modules, which are caches (an LSTM's ``_flat_weights``)."""
    if not isinstance(owner, torch.nn.Module):
        return dict(attrs)
    builtin = type(owner).__module__.startswith("torch.")
    return {k: attrs[k] for k in _module_attributes(tuple(attrs), builtin)}


@functools.lru_cache(maxsize=1024)
def _module_attributes(names: tuple[str, ...], builtin: bool) -> tuple[str, ...]:
    """The names in ``names`` that ``_attributes`` keeps, cached: a module's names rarely
    change."""
    return tuple(k for k in names if k not in _BOOKKEEPING and not (builtin and k[:1] == "_"))


def _same_contents(value, before) -> bool:
    """Whether a list, dict or set holds what its probe's snapshot ``before`` held. A
    dict's keys may come in another order."""
    if isinstance(value, dict):
        old = _pairs(before)
        return value.keys() == old.keys() and all(value[k] is old[k] for k in value)
    if isinstance(value, list):
        return len(value) == len(before) and all(a is b for a, b in zip(value, before))
    return len(value) == len(before) and all(v in before for v in value)


def _variable(probe: tuple):
    """What a ``_CELL`` or ``_ITEM`` probe reads now, or ``_MISSING`` when deleted."""
    if probe[0] == _CELL:
        try:
            return probe[1].cell_contents
        except ValueError:
            return _MISSING
    return probe[1].get(probe[2], _MISSING)


def _refuse_change(role: tuple, probe: tuple, before, label: str) -> None:
    """Raise for what the branch changed at ``probe``, which read ``before``. A change
    that the role allows (a module's bookkeeping, a dict's order) passes."""
    what, text = role[0], role[1]
    if what == _AUTOGRAD:
        changed = before.changed()  # the snapshot's _C.AutogradHold of the tensor
        if changed is not None:
            refuse_autograd_state(label, changed, probe[1], text)
    elif what == _VARIABLE:
        value = _variable(probe)
        if value is _MISSING:
            refuse_deletion(label, text)
        refuse_variable(label, text, value)
    elif what == _CONTENTS:
        if not _same_contents(probe[1], before):
            refuse_python_state(label, text, type(probe[1]).__name__)
    elif what == _ATTRIBUTES:
        old, now = _attributes(role[2], _pairs(before)), _attributes(role[2], probe[1])
        for name in _differing(old, now):
            if name not in now:
                refuse_deletion(label, f"{text}.{name}")
            refuse_attribute(label, f"{text}.{name}", now[name])
    elif role[3] != "_buffers":  # watch_after settles the buffers
        old, now = _pairs(before), probe[1]
        for name in _differing(old, now):
            attr = f"{text}.{name}"
            new = now.get(name, ABSENT)
            check_registry_change(label, attr, role[3], old.get(name, ABSENT), new, False)


def _put_back(role: tuple, probe: tuple, before) -> None:
    """Give what ``probe`` reads the value its snapshot ``before`` holds."""
    what, value = role[0], probe[1]
    if what == _AUTOGRAD:
        before.put_back()
    elif what == _VARIABLE:
        if probe[0] == _CELL:
            value.cell_contents = before
        else:
            value[probe[2]] = before
    elif what == _ATTRIBUTES:
        old = _attributes(role[2], _pairs(before))
        for name in _attributes(role[2], value):
            if name not in old:
                del value[name]
        value.update(old)
    elif isinstance(value, list):
        value[:] = before
    elif not (isinstance(value, dict) and _same_contents(value, before)):
        value.clear()
        value.update(_pairs(before) if isinstance(value, dict) else before)


# Code whose objects keep their state to themselves: torch's, torchcond's and Python's.
_LIBRARIES = frozenset(("torch", "torchcond", *sys.stdlib_module_names))


def _user_code(value) -> bool:
    return _user_module(getattr(value, "__module__", None) or "")


@functools.lru_cache(maxsize=1024)
def _user_module(module: str) -> bool:
    return module.split(".")[0] not in _LIBRARIES


@functools.lru_cache(maxsize=1024)
def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """Return the names that ``code`` and its nested code may read as globals, each
    once. Code objects are immutable, so the answer is cached."""
    names = dict.fromkeys(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(dict.fromkeys(_global_names(const)))
    return tuple(names)


_MAX_DEPTH = 4  # How deep the walk follows functions through closures and globals.
_MAX_NESTING = 8  # How deep it follows attributes and items from a value a function reads.
_SEQUENCES = (list, tuple, dict, set)
# Values that hold no state of their own, which the walk passes over.
_ATOMS = frozenset((int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device))


def _reachable(fn: Callable, probes: list) -> _Finder:
    """Return the walk of what ``fn`` reaches through closures, ``self``, defaults and
    globals: the ``roles`` of its probes, and the ``iterators`` it reaches. ``probes``
    receives a probe of everything read here, except ``fn``'s own attributes
    (``_root_attributes``)."""
    finder = _Finder(fn, probes)
    finder.visit(fn, getattr(fn, "__name__", "the branch"), 0)
    return finder


def _is_code(value) -> bool:
    """Whether the walk follows ``value`` as a function (``_MAX_DEPTH``), not as data."""
    return callable(value) and not isinstance(value, (torch.nn.Module, type))


class _Finder:
    """``_reachable``'s walk. It follows functions a few levels deep. It finds modules
    (with their submodules), user objects, variables, tensors and containers, and what
    their attributes and items hold in turn. It reads what is there now, so a variable
    rebound or a submodule added between calls is watched too. It is a class because
    nested functions would hold each other (and ``fn``) in a cycle, alive until the
    cycle collector runs."""

    def __init__(self, fn: Callable, probes: list):
        self.fn = fn
        self.probes = probes
        self.roles: dict[int, tuple] = {}
        self.iterators: list[tuple[str, Any]] = []
        self.seen: set[int] = set()

    def watch(self, probe: tuple, role: tuple) -> None:
        """Add ``probe``, where a change is what ``role`` says (``_refuse_change``)."""
        self.roles[len(self.probes)] = role
        self.probes.append(probe)

    def watch_object(self, text: str, obj, depth: int, nest: int) -> None:
        """Watch a module's registries or a user object's attributes, and what they hold."""
        if isinstance(obj, torch.nn.Module):
            for registry in _REGISTRIES:
                self.watch((_DICT, getattr(obj, registry)), (_REGISTRY, text, obj, registry))
            own = {**_compat.module_parameters(obj), **_compat.module_buffers(obj)}
            self.visit_items(text, own, depth, nest, ".{}")
        self.watch((_DICT, vars(obj)), (_ATTRIBUTES, text, obj))
        self.visit_items(text, _attributes(obj, vars(obj)), depth, nest, ".{}")

    def visit_items(
        self, text: str, items: dict, depth: int, nest: int, key: str, watched: bool = True
    ) -> None:
        """Visit the values in ``items``, each named as ``text`` and its ``key``."""
        for k, value in items.items():
            if type(value) not in _ATOMS:
                self.visit(value, text + key.format(k), depth, nest + 1, watched)

    def visit(self, value, text: str, depth: int, nest: int = 0, watched: bool = True) -> None:
        """Visit ``value``, which the branch reaches as ``text``. A container that only
        a library's code holds (``watched`` false) is read, not watched."""
        seen, probes = self.seen, self.probes
        if id(value) in seen or nest > _MAX_NESTING or (depth > _MAX_DEPTH and _is_code(value)):
            if value is self.fn:  # It reaches itself, so _found keeps no record.
                probes.append((_TYPE, value))
            return
        seen.add(id(value))
        # A function's type never changes, and the root's record may not hold the root
        # (_Found), so the root gets no type probe.
        if value is not self.fn:
            probes.append((_TYPE, value))
        if isinstance(value, torch.Tensor):
            self.watch((_TENSOR, value), (_AUTOGRAD, text))
        elif isinstance(value, torch.nn.Module):
            for name, module in value.named_modules():
                if name == "" or id(module) not in seen:
                    seen.add(id(module))
                    probes.append((_TYPE, module))
                    self.watch_object(f"{text}.{name}" if name else text, module, depth, nest)
        elif isinstance(value, types.MethodType):
            self.visit(value.__self__, "self", depth)
            self.visit(value.__func__, text, depth)
        elif isinstance(value, types.FunctionType):
            self.visit_function(value, depth)
        elif isinstance(value, functools.partial):
            probes.extend((_ATTR, value, a) for a in ("func", "args", "keywords"))
            probes.append((_DICT, value.keywords))
            for part in (value.func, *value.args, *value.keywords.values()):
                self.visit(part, text, depth + 1)
        elif isinstance(value, Iterator):  # itertools.count(), a generator, an open file
            self.iterators.append((text, value))
        elif callable(value) and not _user_code(type(value)) and hasattr(value, "__dict__"):
            probes.append((_DICT, vars(value)))
            for name, part in vars(value).items():  # Such as torchcond's wrappers of a branch.
                self.visit(part, name, depth + 1, watched=False)
        elif _user_code(type(value)) and hasattr(value, "__dict__") and not isinstance(value, type):
            self.watch_object(text, value, depth, nest)
        elif isinstance(value, _SEQUENCES):
            probe = _contents_probe(value)
            if probe is not None and watched:
                self.watch(probe, (_CONTENTS, text))
            elif probe is not None:
                probes.append(probe)
            if isinstance(value, set):
                items, text, key = {k: k for k in value}, f"an item of {text}", ""
            else:
                items = value if isinstance(value, dict) else dict(enumerate(value))
                key = "[{!r}]"
            self.visit_items(text, items, depth, nest, key, watched)

    def visit_function(self, f: types.FunctionType, depth: int) -> None:
        probes = self.probes
        if f is not self.fn:
            probes.extend((_ATTR, f, a) for a in ("__code__", "__defaults__", "__module__"))
            probes.append((_ATTR, f, "__kwdefaults__"))
        if f.__kwdefaults__ is not None:
            probes.append((_DICT, f.__kwdefaults__))
        user = _user_code(f)
        code = f.__code__
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                contents = cell.cell_contents
            except ValueError:  # The cell is not bound yet.
                probes.append((_CELL, cell))
                continue
            if user:
                self.watch((_CELL, cell), (_VARIABLE, name))
            else:
                probes.append((_CELL, cell))
            self.visit(contents, name, depth + 1)
        for default in (*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values()):
            self.visit(default, "a default argument", depth + 1)
        if not user:
            return
        namespace = f.__globals__
        for name in _global_names(code):
            if name in namespace and not isinstance(namespace[name], types.ModuleType):
                self.watch((_ITEM, namespace, name), (_VARIABLE, name))
                self.visit(namespace[name], name, depth + 1)
            else:  # An absent name or a module is only read.
                probes.append((_ITEM, namespace, name))
