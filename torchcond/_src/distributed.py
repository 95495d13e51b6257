"""Conditionals over DTensors (``torch.distributed.tensor``). One rule serves both operators.

A DTensor is one logical tensor spread over a device mesh. Every rank holds a local
tensor. The placements (``Replicate()``, ``Shard(dim)``, ``Partial()``) say how the
local tensors make up the whole. A conditional over DTensors does what the same code
written with a Python ``if`` does, and every rank takes the same branch:

* The selector must have one value on every rank. It is a plain tensor, or a DTensor
  whose placements are all ``Replicate()``. Any other DTensor selector raises
  ``CondArgumentError``, whose message names what reduces it. Ranks that read their
  own parts could take different branches, and then wait forever in different
  collectives.
* When the selector can be read (eagerly), the taken branch runs on the DTensors
  themselves. DTensor then propagates shardings and issues collectives through it, as
  it would through plain code.
* Otherwise the operator runs on the local tensors. This happens in a trace that
  unwraps DTensors, as AOTAutograd does under ``torch.compile``. Each branch wraps
  the local tensors back into DTensors, so the branch graphs hold the local ops and
  collectives that DTensor chose. One graph has one layout per output, so every
  branch must give each output the same mesh and placements. Otherwise the call
  raises ``BranchMismatchError``.

Importing ``torch.distributed.tensor`` takes time, so this module does not import it.
The rule is registered once the program imports it (``after_import``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import torch

from .. import _compat
from .._compat.after_import import when_imported
from ..errors import BranchMismatchError, CondArgumentError
from .host import HOST_READABLE, host_readable
from .kinds import ConditionalKind, unpack

_DTENSOR_MODULE = "torch.distributed.tensor"


class _Layout(NamedTuple):
    """How a DTensor lies on its mesh. It holds what wraps a local tensor back into it."""

    mesh: Any
    placements: tuple
    shape: torch.Size | None  # The global shape, or None to infer it from the local one.
    stride: tuple | None


def install(kinds) -> None:
    """Register the rule on the operators of ``kinds`` once ``torch.distributed.tensor``
    is imported."""
    when_imported(_DTENSOR_MODULE, lambda module: _register(module, kinds))


def _register(module: ModuleType, kinds) -> None:
    dtensor = module.DTensor
    HOST_READABLE[dtensor] = _replicated
    for kind in kinds:
        _install(kind, dtensor)


def _replicated(t: Any) -> bool:
    """True when every process holds the DTensor's whole value, so the host can read it."""
    return all(p.is_replicate() for p in t.placements)


def _install(kind: ConditionalKind, dtensor: Any) -> None:
    @kind.op.py_impl(dtensor)
    def rule(*args):
        return _on_dtensors(kind, dtensor, *unpack(args))


def _on_dtensors(kind: ConditionalKind, dtensor: Any, selector, branches, operands):
    """Run a conditional with DTensors among its selector or operands (module docstring)."""
    if isinstance(selector, dtensor):
        selector = _replicated_value(kind, selector)
    if host_readable(selector):
        return kind.taken_branch(selector, branches)(*operands)
    layouts = [_layout_of(t, dtensor) for t in operands]
    local = tuple(t if lay is None else t.to_local() for t, lay in zip(operands, layouts))
    returned: list = [None] * len(branches)  # Each branch's output layouts, set when it runs.
    local_branches = [
        _on_local(branch, layouts, dtensor, returned, i) for i, branch in enumerate(branches)
    ]
    out = kind.op(selector, *local_branches, local)
    if all(r is None for r in returned):  # No branch ran, so no layouts were recorded.
        return out
    return _wrapped(out, _agreed(kind.labels(len(branches)), returned), dtensor)


def _replicated_value(kind: ConditionalKind, selector):
    """Return the selector's local tensor, which holds its whole value on every rank."""
    if _replicated(selector):
        return selector.to_local()
    arg = kind.selector_arg
    raise CondArgumentError(
        f"{kind.name}: argument '{arg}' is a DTensor placed as {tuple(selector.placements)}, "
        "so ranks hold different parts of its value and could take different branches; "
        f"reduce it to one value on every rank first: {arg}.full_tensor(), or "
        f"{arg}.redistribute(placements=[Replicate()] * {arg}.device_mesh.ndim)"
    )


def _on_local(
    branch: Callable, layouts: Sequence[_Layout | None], dtensor: Any, returned: list, i: int
) -> Callable:
    """Return ``branch`` as a function of local tensors. It wraps them into the operands'
    DTensors, unwraps the outputs and records their layouts in ``returned[i]``."""

    def local_branch(*local):
        out = tuple(branch(*_wrapped(local, layouts, dtensor)))
        returned[i] = [_layout_of(o, dtensor) for o in out]
        return tuple(o if lay is None else o.to_local() for o, lay in zip(out, returned[i]))

    return local_branch


def _layout_of(value, dtensor: Any) -> _Layout | None:
    if not isinstance(value, dtensor):
        return None
    return _Layout(value.device_mesh, tuple(value.placements), value.shape, value.stride())


def _wrapped(values, layouts: Sequence[_Layout | None], dtensor: Any) -> tuple:
    return tuple(
        v
        if lay is None
        else dtensor.from_local(
            v, lay.mesh, lay.placements, run_check=False, shape=lay.shape, stride=lay.stride
        )
        for v, lay in zip(values, layouts)
    )


def _agreed(labels: Sequence[str], returned: list) -> list[_Layout | None]:
    """Return one layout per output, which every branch that ran must share. The layout
    keeps its global shape and stride only where all branches' are statically equal.
    Otherwise ``from_local`` infers them from the local tensor and assumes even sharding."""
    ran = [(label, outs) for label, outs in zip(labels, returned) if outs is not None]
    (first_label, first), rest = ran[0], ran[1:]
    agreed: list[_Layout | None] = []
    for j, lay in enumerate(first):
        for label, outs in rest:
            other = outs[j]
            if lay is None and other is None:
                continue
            if lay is None or other is None or lay.placements != other.placements:
                found = f"{first_label} gives {_describe(lay)} and {label} {_describe(other)}"
            elif lay.mesh != other.mesh:
                found = f"{first_label} and {label} give DTensors on different device meshes"
            else:
                continue
            raise BranchMismatchError.at(
                "output",
                j,
                "{path}: branches must agree on DTensor placements when the conditional is "
                f"traced; {found} (redistribute one of them in its branch)",
            )
        if lay is not None and not all(_same_sizes(lay, outs[j]) for _, outs in rest):
            lay = lay._replace(shape=None, stride=None)
        agreed.append(lay)
    return agreed


def _same_sizes(a: _Layout, b: _Layout) -> bool:
    pairs = [(a.shape, b.shape), (a.stride, b.stride)]
    return all(
        x is not None
        and y is not None
        and len(x) == len(y)
        and all(_compat.same_size(p, q) for p, q in zip(x, y))
        for x, y in pairs
    )


def _describe(layout: _Layout | None) -> str:
    return "a plain tensor" if layout is None else f"a DTensor placed as {layout.placements}"
