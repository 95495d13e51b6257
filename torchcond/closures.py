"""Closures over tensors that require grad, found and bound without a tracer.

Inside a make_fx session closures are lifted by tracing (``tracing.trace_branches``).
With no tracer, as in AOTAutograd's metadata pass over fake tensors, a branch is run
once while every tensor handed to a torch function is recorded; a tensor the branch
neither received nor produced, and that requires grad, is a closure autograd must
see. ``bind`` then makes it an explicit input: the branch runs with each such tensor
replaced, at every torch function call, by the value passed in its place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ._compat import pytree
from .tracing import SpecCarrier


class _Recorder(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.read: dict[int, torch.Tensor] = {}
        self.made: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        for value in pytree.tree_leaves((args, kwargs)):
            if isinstance(value, torch.Tensor) and id(value) not in self.made:
                self.read.setdefault(id(value), value)
        out = func(*args, **(kwargs or {}))
        for value in pytree.tree_leaves(out):
            if isinstance(value, torch.Tensor):
                self.made.add(id(value))
        return out


def grad_closures(branches: Sequence[Callable], operands: tuple) -> list[torch.Tensor]:
    """Tensors that some branch reads without receiving them, and that require grad."""
    recorder = _Recorder()
    with torch.no_grad(), recorder:
        for branch in branches:
            branch(*operands)
    given = {id(t) for t in operands}
    return [
        t for key, t in recorder.read.items() if key not in given and t.requires_grad
    ]


class _Substitute(torch.overrides.TorchFunctionMode):
    def __init__(self, replacements: dict[int, torch.Tensor]):
        super().__init__()
        self.replacements = replacements

    def __torch_function__(self, func, types, args=(), kwargs=None):
        def swap(value):
            return self.replacements.get(id(value), value)

        args, kwargs = pytree.tree_map_only(torch.Tensor, swap, (args, kwargs or {}))
        return func(*args, **kwargs)


def bind(branch: Callable, closures: Sequence[torch.Tensor], n_operands: int) -> Callable:
    """``branch`` taking ``(*operands, *closure_values)``."""

    def bound(*args):
        values = args[n_operands:]
        with _Substitute({id(c): v for c, v in zip(closures, values)}):
            return branch(*args[:n_operands])

    return SpecCarrier(bound, branch)
