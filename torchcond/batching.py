"""vmap of a conditional whose selector is the same for every example.

Each branch is vmapped and the conditional stays one conditional, so under tracing
the batched program still has one node per conditional. A selector that differs per
example cannot pick one branch: that needs running every branch and a device-side
select, which this module refuses clearly for now.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import _compat
from .errors import UnsupportedCondError
from .forms import Form
from .tracing import SpecCarrier


def vmap_rule(form: Form, interpreter, selector, branches, operands):
    """The functorch Vmap-key rule of both operators."""
    level = interpreter.level()
    if isinstance(selector, torch.Tensor) and _compat.batched_at(selector, level):
        refuse_batched_selector(form)
    tensors, in_dims = zip(*[_compat.unbatch(t, level) for t in operands]) if operands else ((), ())
    mapped = vmapped_branches(branches, in_dims, interpreter.randomness())
    with interpreter.lower():
        out = form.op(selector, *mapped, tuple(tensors))
    return tuple(_compat.batch(t, 0, level) for t in out)


def vmapped_branches(branches: Sequence[Callable], in_dims: Sequence, randomness: str):
    """Each branch under ``torch.vmap``, batch dimension first on every output."""
    return [
        SpecCarrier(torch.vmap(b, in_dims=tuple(in_dims), out_dims=0, randomness=randomness), b)
        for b in branches
    ]


def refuse_batched_selector(form: Form):
    raise UnsupportedCondError(
        f"{form.op.name()}: vmap over a conditional whose selector is batched (one "
        "value per example) is not supported yet: no single branch can be chosen. "
        "Compute both results and combine them with torch.where, or keep the "
        "selector unbatched"
    )
