"""What every dispatch rule shares: the two operators' forms and the selector.

Both operators are one conditional over N branches, called as
``op(selector, *branches, operands)``. A ``Form`` holds what differs between them:
how the selector picks a branch, how branches are labelled in messages, and how
their graphs are named in a traced module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import _compat


class Form:
    """What differs between the operators: branch choice, labels, graph names."""

    def __init__(self, op, taken, labels, graph_names, branch_of):
        self.op = op
        # selector tensor -> int64 tensor of the branch each element takes (device side)
        self.branch_of: Callable[[torch.Tensor, int], torch.Tensor] = branch_of
        self.taken: Callable[[object, int], int] = taken
        self.labels: Callable[[int], list[str]] = labels
        self.graph_names: Callable[[torch.nn.Module, int], list[str]] = graph_names

    def taken_branch(self, selector, branches: Sequence[Callable]) -> Callable:
        return branches[self.taken(selector, len(branches))]

    def call_below_autograd(self, selector, branches, operands):
        """The operator again, past the Autograd key (its autograd rule already ran)."""
        with _compat.below_autograd():
            return self.op(*pack(selector, branches, operands))


def clamp_index(index: int, n: int) -> int:
    return min(max(index, 0), n - 1)


def host_index(index) -> int:
    """A concrete index as a Python int. ``int()`` of a uint64 tensor at or above 2**63
    overflows; ``item()`` gives the true value, which then clamps to the last branch."""
    return int(index.item()) if isinstance(index, torch.Tensor) else int(index)


def cond_branch_of(pred: torch.Tensor, n: int) -> torch.Tensor:
    """True takes branch 0 (``true_fn``), false branch 1."""
    return (pred == 0).to(torch.int64)


_INT64_MAX = torch.iinfo(torch.int64).max


def switch_branch_of(index: torch.Tensor, n: int) -> torch.Tensor:
    """The index clamped to ``[0, n - 1]`` as int64, in every mode.

    int64 first: a narrow dtype (uint8, int8) cannot even hold ``n - 1`` for many
    branches. A uint64 value at or above 2**63 wraps to a negative int64; it is large,
    so it takes the last branch, as on the host and in ``select_n``'s kernel.
    """
    wide = index.to(torch.int64)
    if index.dtype == torch.uint64:
        wide = torch.where(wide < 0, _INT64_MAX, wide)
    return wide.clamp(0, n - 1)


def unpack(args: tuple) -> tuple:
    """``(selector, *branches, operands)`` -> ``(selector, branches, operands)``."""
    return args[0], args[1:-1], args[-1]


def pack(selector, branches: Sequence, operands: tuple) -> tuple:
    return (selector, *branches, operands)


def readable_on_host(selector) -> bool:
    """Readable on the host right now: no tracing active, a real tensor or a number.

    Under a tracing mode the Autograd key runs before the mode's rule; reading the
    selector there would inline one branch into the trace, so it never counts.
    """
    if _compat.tracing():
        return False
    if isinstance(selector, torch.Tensor):
        if _compat.is_functorch_wrapped(selector):
            if _compat.is_vmapped(selector):
                return False
            selector = _compat.functorch_base(selector)
        return type(selector) is torch.Tensor and selector.device.type != "meta"
    return isinstance(selector, (bool, int))


def python_scalar(value):
    """NumPy scalars (np.bool_, np.float32, ...) as the Python numbers they hold."""
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        return value.item()
    return value
