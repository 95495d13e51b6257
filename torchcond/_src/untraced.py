"""Tensors of a torch.func transform that an export trace never recorded.

torch.export traces above the torch.func transforms (a pre-dispatch trace). Torch
2.11-2.15 does not record how grad, vjp, jacrev and hessian wrap the inputs they
differentiate. It also does not record a tensor that jvp makes without a tangent,
such as the result of ``full_like``. Such a tensor enters the graph as a constant,
so the exported program ignores its inputs, with or without a conditional. A
conditional refuses such a tensor by name instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from .. import _compat
from .._compat.dynamo import compile_time_error, raise_at_compile_time
from ..errors import UnsupportedCondError


def refuse_untraced(what: str, labelled: Iterable[tuple[str, object]], tracer=None) -> None:
    """Raise if ``tracer`` never recorded a torch.func tensor in ``labelled``.

    ``labelled`` holds ``(label, value)`` pairs. ``tracer`` is a pre-dispatch trace and
    defaults to the active one. Without such a trace this does nothing and never reads
    ``labelled``, so ``labelled`` may be a generator."""
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
    """Raise if a grad or jvp level wraps a tensor in ``labelled`` during export.

    This runs in dynamo's pass of a strict export, under a level that export does not
    record. Dynamo passes the error on to the caller unchanged."""
    if not _compat.exporting_under_unexported_level():
        return
    for label, t in labelled:
        if isinstance(t, torch.Tensor) and _compat.is_differentiated_by_transform(t):
            raise compile_time_error(UnsupportedCondError, refusal(what, label))


def refuse_unexported_in_dynamo(what: str) -> None:
    """Raise as the eager call does, in dynamo's pass of a strict export under a level
    that export does not record (``_compat.unexported_level_active``). Dynamo shows the
    tensors of the every-branch path without wrappers, so this checks the levels."""
    if _compat.is_dynamo_compiling() and _compat.exporting_under_unexported_level():
        raise_at_compile_time(
            UnsupportedCondError, refusal(what, "an operand under this torch.func transform")
        )


def refusal(what: str, label: str) -> str:
    """Return the error message for ``label``, a tensor that the trace never recorded."""
    return (
        f"{what}: {label} is a tensor of a torch.func transform that the export "
        "trace does not record, so the exported program would hold it as a "
        "constant and ignore its inputs (torch records no grad, vjp, jacrev or "
        "hessian inside torch.export, nor a tensor made without a tangent under "
        "jvp, nor any jvp before torch 2.13); export the function and apply the "
        "transform to the exported module, or trace with make_fx"
    )


def labelled_inputs(selector, operands, n_given: int) -> Iterator[tuple[str, object]]:
    """Yield a conditional's selector and operands with labels. The operands after the
    first ``n_given`` are tensors that its branches close over."""
    yield "the selector", selector
    for i, t in enumerate(operands):
        yield (f"operands leaf {i}" if i < n_given else "a tensor a branch closes over"), t
