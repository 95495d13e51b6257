"""Tensors of a torch.func transform that an export trace never recorded.

torch.export traces above the torch.func transforms (a pre-dispatch trace), but torch
(2.11-2.15) records neither the wrapping of the inputs grad, vjp, jacrev and hessian
differentiate, nor a tensor made without a tangent under jvp (``full_like``, say).
Such a tensor enters the graph as a constant, and the exported program ignores its
inputs, with or without a conditional. A conditional refuses it by name instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from .. import _compat
from .._compat.dynamo import compile_time_error, raise_at_compile_time
from ..errors import UnsupportedCondError


def refuse_untraced(what: str, labelled: Iterable[tuple[str, object]], tracer=None) -> None:
    """Raises if a tensor in ``labelled`` (``(label, value)`` pairs) is a torch.func
    transform's that the pre-dispatch trace ``tracer`` (default: the active one) never
    recorded. Nothing to do outside such a trace; ``labelled`` may be a generator,
    read only inside one."""
    if tracer is None and not _compat.is_dynamo_compiling() and _compat.pre_dispatch_tracing():
        tracer = _compat.pre_dispatch_tracer()
    if tracer is None:
        return
    for label, t in labelled:
        if (
            isinstance(t, torch.Tensor)
            and _compat.is_functorch_wrapped(t)
            and _compat.get_proxy_slot(t, tracer, None) is None
        ):
            raise UnsupportedCondError(refusal(what, label))


def refuse_wrapped_in_export(what: str, labelled: Iterable[tuple[str, object]]) -> None:
    """Under torch.export and a level it does not record (dynamo's pass of a strict
    export, which records the graph the export then traces): raises, as dynamo passes
    it on, if a tensor in ``labelled`` is wrapped by a grad or jvp level."""
    if not _compat.exporting_under_unexported_level():
        return
    for label, t in labelled:
        if isinstance(t, torch.Tensor) and _compat.is_differentiated_by_transform(t):
            raise compile_time_error(UnsupportedCondError, refusal(what, label))


def refuse_unexported_in_dynamo(what: str) -> None:
    """In dynamo's pass of a strict export, under a level export does not record
    (``_compat.unexported_level_active``): raises, as eagerly. The path where every
    branch runs is plain code there, whose tensors dynamo shows without wrappers."""
    if _compat.is_dynamo_compiling() and _compat.exporting_under_unexported_level():
        raise_at_compile_time(
            UnsupportedCondError, refusal(what, "an operand under this torch.func transform")
        )


def refusal(what: str, label: str) -> str:
    """The message for ``label``, a tensor of a transform the trace never recorded."""
    return (
        f"{what}: {label} is a tensor of a torch.func transform that the export "
        "trace does not record, so the exported program would hold it as a "
        "constant and ignore its inputs (torch records no grad, vjp, jacrev or "
        "hessian inside torch.export, nor a tensor made without a tangent under "
        "jvp, nor any jvp before torch 2.13); export the function and apply the "
        "transform to the exported module, or trace with make_fx"
    )


def labelled_inputs(selector, operands, n_given: int) -> Iterator[tuple[str, object]]:
    """A conditional's selector and operands, labelled; those after the first
    ``n_given`` are tensors its branches close over."""
    yield "the selector", selector
    for i, t in enumerate(operands):
        yield (f"operands leaf {i}" if i < n_given else "a tensor a branch closes over"), t
