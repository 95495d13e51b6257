"""Conditionals under dispatch modes that trace nothing: a user's ``TorchDispatchMode``,
a mode that takes higher-order operators (``DebugMode``), and ``FlopCounterMode``.

torch's own modes (fake, proxy, functional) have rules of their own in ops.py.
torch finds a mode's rule by the mode's exact type, so every other mode would get
none. What the mode on top of the dispatch stack gets here:

* a mode with no rule (a user's logging mode): the conditional is a Python ``if``.
  The taken branch runs with the mode still active, so the mode sees its aten ops and
  no others, and autograd records them (this runs at the Autograd key, ahead of the
  conditional's autograd rule). When the selector cannot be read (meta, fake, or a
  trace beneath the mode), the mode steps aside: the conditional runs as it would
  without it, and the mode sees none of its branches' ops.
* a mode with ``supports_higher_order_operators`` (torch's contract): the operator
  itself, in its ``__torch_dispatch__``, with the mode popped. Calling it back runs
  the conditional as it would without the mode (a Python ``if`` for a readable
  selector). ``NotImplemented`` makes it a mode with no rule (above).
* ``FlopCounterMode``: what it counts for ``torch.cond`` (its upper bound: for each
  module and op the largest count of any branch), through torch's own code, N
  branches as nested two-way conditionals. With a readable selector the taken branch
  runs for real, under autograd (its backward counts as a Python ``if``'s would), and
  the others run on fake copies of their operands, so they read and write nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import _compat
from .._compat import pytree
from .host import UNDER_MODE, host_readable, traces
from .kinds import ConditionalKind, pack

# What the mode on top of the dispatch stack is to a conditional.
USER, TAKES_HOPS, COUNTS_FLOPS = "user", "takes higher-order operators", "counts flops"
USER_MODES = (USER, TAKES_HOPS)  # what ``python_key_rule`` takes (the others: py_impl)


def kind_of(op, mode) -> str | None:
    """``USER``, ``TAKES_HOPS`` or ``COUNTS_FLOPS``; None for a mode that traces (it
    has a rule of ours, as torch's fake, proxy and functional modes do) and for a
    subclass of one (torch's lookup does not find its base's rule: left to torch)."""
    if type(mode) is _compat.FlopCounterDispatchMode:
        return COUNTS_FLOPS
    if traces(op, mode):
        return None
    return TAKES_HOPS if getattr(mode, "supports_higher_order_operators", False) else USER


def top_kind(op) -> str | None:
    mode = _compat.current_dispatch_mode()
    return None if mode is None else kind_of(op, mode)


# --- the rules ------------------------------------------------------------------------


def takes_first(op) -> bool:
    """A mode that traces nothing is on top: it takes the conditional at the Autograd
    key, ahead of the conditional's autograd rule (which, seeing a mode, would treat the
    selector as unreadable and run every branch to find closures)."""
    return bool(_compat.len_dispatch_stack()) and top_kind(op) is not None


def autograd_rule(ckind: ConditionalKind, selector, branches, operands):
    """At the Autograd key, for a mode that ``takes_first``."""
    kind = top_kind(ckind.op)
    if kind == COUNTS_FLOPS:
        with _compat.pop_dispatch_mode() as mode:
            return flop_rule(ckind, mode, selector, branches, operands)
    return python_key_rule(ckind, selector, branches, operands)


def python_key_rule(kind: ConditionalKind, selector, branches, operands):
    """At the Python key, for a mode of kind ``USER`` or ``TAKES_HOPS`` (``dispatch``)."""
    if top_kind(kind.op) == TAKES_HOPS:
        with _compat.pop_dispatch_mode() as mode:
            out = mode.__torch_dispatch__(kind.op, [], pack(selector, branches, operands), {})
        if out is not NotImplemented:
            return out
    return user_mode_rule(kind, selector, branches, operands)


def user_mode_rule(kind: ConditionalKind, selector, branches, operands):
    """A Python ``if`` under the mode; a conditional beneath it when unreadable."""
    if host_readable(selector, UNDER_MODE, kind.op):
        return kind.taken_branch(selector, branches)(*operands)
    with _compat.pop_dispatch_mode():
        return kind.op(*pack(selector, branches, operands))


def flop_rule(kind: ConditionalKind, mode, selector, branches, operands):
    """``FlopCounterMode``'s count for the conditional (``mode`` popped), and its value.

    Readable: the taken branch's output, from its one run for real; the others run on
    fake copies. Otherwise every branch runs as given (on fake copies where operands
    are real, as under a real-tensor make_fx trace), outside any make_fx trace, and the
    value is the conditional's as it would be without the mode.
    """
    labels = [f"torchcond.{kind.name}'s {label}" for label in kind.labels(len(branches))]
    if host_readable(selector, UNDER_MODE, kind.op):
        taken = kind.taken_index(selector, len(branches))
        ran: list = []

        def run_taken(*args):
            ran.append(branches[taken](*args))
            return ran[0]

        fns = [
            run_taken if i == taken else _on_fake(mode, b, label)
            for i, (b, label) in enumerate(zip(branches, labels))
        ]
        upper_bound(mode, fns, operands)
        return ran[0]
    if any(_compat.is_real_tensor(t) for t in operands):
        fns = [_on_fake(mode, b, label) for b, label in zip(branches, labels)]
    else:
        fns = [_without_grad(b) for b in branches]
    with _compat.disable_proxy_modes_tracing():
        upper_bound(mode, fns, operands)
    # The value, counted by nobody: the rules below may call branch graphs below the
    # Autograd key, where the counter's module tracker would fail (_compat).
    with _compat.modules_untracked(mode):
        return kind.op(*pack(selector, branches, operands))


def upper_bound(mode, fns: Sequence[Callable], operands: tuple) -> None:
    """Count ``fns`` as torch counts ``torch.cond``: ``fns[0]`` against the rest, the
    rest as a conditional of their own (``mode`` popped on entry)."""
    if len(fns) == 1:
        with mode:
            fns[0](*operands)
        return

    def rest(*args):
        with _compat.pop_dispatch_mode():  # the outer count pushed ``mode``; so does this one
            upper_bound(mode, fns[1:], args)

    _compat.count_cond_flops(mode, fns[0], fns[1] if len(fns) == 2 else rest, operands)


def _without_grad(branch: Callable) -> Callable:
    def run(*args):
        with torch.no_grad():
            return branch(*args)

    return run


def _on_fake(counting, branch: Callable, label: str) -> Callable:
    """``branch`` run for its count only, on fake tensors: a fake mode beneath the
    counting one makes what it creates fake, and every real tensor a torch function
    gets (operand or closure) is replaced by a fake copy, so nothing real is read or
    written. A branch that cannot run on fake tensors is not counted, with a warning.
    """

    def run(*args):
        fake_mode: Any = _compat.FakeTensorMode(allow_non_fake_inputs=True)
        try:
            with (
                _compat.every_mode_set_aside(),  # the modes beneath see nothing of it
                fake_mode,
                counting,
                torch.no_grad(),
                _Fakes(fake_mode) as fakes,
            ):
                branch(*fakes.of(args))
        except Exception as error:
            warnings.warn(
                f"FlopCounterMode: {label} did not run on fake tensors, so its flops are "
                f"not in the conditional's upper bound ({type(error).__name__}: {error})",
                UserWarning,
                stacklevel=2,
            )

    return run


class _Fakes(torch.overrides.TorchFunctionMode):
    """Hands torch functions a fake copy of each real tensor, the same one each time."""

    def __init__(self, fake_mode):
        super().__init__()
        self.fake_mode = fake_mode

    def of(self, values):
        return pytree.tree_map_only(torch.Tensor, self._fake, values)

    def _fake(self, t: torch.Tensor) -> torch.Tensor:
        return self.fake_mode.from_tensor(t) if _compat.is_real_tensor(t) else t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        args, kwargs = self.of((args, kwargs or {}))
        return func(*args, **kwargs)
