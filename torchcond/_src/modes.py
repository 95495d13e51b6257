"""Conditionals under dispatch modes that trace nothing.

These modes are a user's ``TorchDispatchMode``, a mode that takes higher-order
operators (``DebugMode``), and ``FlopCounterMode``. torch's own modes (fake, proxy,
functional) have their own rules in ops.py. torch finds a mode's rule by the mode's
exact type, so every other mode would get no rule. This module handles the mode on
top of the dispatch stack:

* A mode with no rule, such as a user's logging mode, sees a Python ``if``. The taken
  branch runs with the mode still active. The mode sees that branch's aten ops and no
  others, and autograd records them. This runs at the Autograd key, ahead of the
  conditional's autograd rule. When the selector cannot be read (meta, fake, or a
  trace beneath the mode), the mode steps aside. The conditional then runs as it would
  without the mode, and the mode sees none of its branches' ops.
* A mode with ``supports_higher_order_operators`` (torch's contract) gets the operator
  itself in its ``__torch_dispatch__``, with the mode popped. Calling the operator
  back runs the conditional as it would without the mode, which is a Python ``if``
  for a readable selector. A mode that returns ``NotImplemented`` is treated as a
  mode with no rule.
* ``FlopCounterMode`` counts what it counts for ``torch.cond``. That is an upper
  bound: for each module and op, the largest count of any branch. torch's own code
  does the count, with N branches as nested two-way conditionals. With a readable
  selector, the taken branch runs for real under autograd, so its backward counts as
  a Python ``if``'s would. The other branches run on fake copies of their operands,
  so they read and write nothing.
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

# The kinds of mode that can be on top of the dispatch stack.
USER, TAKES_HOPS, COUNTS_FLOPS = "user", "takes higher-order operators", "counts flops"
USER_MODES = (USER, TAKES_HOPS)  # the kinds python_key_rule handles (the others use py_impl)


def kind_of(op, mode) -> str | None:
    """Return ``USER``, ``TAKES_HOPS`` or ``COUNTS_FLOPS`` for ``mode``. Return None for
    a mode that traces and for a subclass of one (see ``host.traces``)."""
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
    """Whether a mode that traces nothing is on top and takes the conditional first."""
    # The mode takes it at the Autograd key, ahead of the conditional's autograd rule.
    # Seeing a mode, that rule would treat the selector as unreadable and run every
    # branch to find closures.
    return bool(_compat.len_dispatch_stack()) and top_kind(op) is not None


def autograd_rule(ckind: ConditionalKind, selector, branches, operands):
    """The rule at the Autograd key, for a mode that ``takes_first``."""
    kind = top_kind(ckind.op)
    if kind == COUNTS_FLOPS:
        with _compat.pop_dispatch_mode() as mode:
            return flop_rule(ckind, mode, selector, branches, operands)
    return python_key_rule(ckind, selector, branches, operands)


def python_key_rule(kind: ConditionalKind, selector, branches, operands):
    """The rule at the Python key, for a mode of kind ``USER`` or ``TAKES_HOPS``.
    The operator's ``dispatch`` calls it."""
    if top_kind(kind.op) == TAKES_HOPS:
        with _compat.pop_dispatch_mode() as mode:
            out = mode.__torch_dispatch__(kind.op, [], pack(selector, branches, operands), {})
        if out is not NotImplemented:
            return out
    return user_mode_rule(kind, selector, branches, operands)


def user_mode_rule(kind: ConditionalKind, selector, branches, operands):
    """Run a Python ``if`` under the mode, or the conditional beneath it if unreadable."""
    if host_readable(selector, UNDER_MODE, kind.op):
        return kind.taken_branch(selector, branches)(*operands)
    with _compat.pop_dispatch_mode():
        return kind.op(*pack(selector, branches, operands))


def flop_rule(kind: ConditionalKind, mode, selector, branches, operands):
    """Count the conditional for ``FlopCounterMode`` (``mode`` popped) and return its value.

    With a readable selector, the value is the taken branch's output from its one real
    run, and the other branches run on fake copies. Otherwise every branch runs outside
    any make_fx trace. Where operands are real, the branches run on fake copies, as
    under a real-tensor make_fx trace. The value is then the conditional's as it would
    be without the mode.
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
    # Nobody counts the run that gives the value. The rules below may call branch graphs
    # below the Autograd key, where the counter's module tracker would fail (_compat).
    with _compat.modules_untracked(mode):
        return kind.op(*pack(selector, branches, operands))


def upper_bound(mode, fns: Sequence[Callable], operands: tuple) -> None:
    """Count ``fns`` as torch counts ``torch.cond``, with ``mode`` popped on entry.
    ``fns[0]`` is counted against the rest, and the rest form a conditional of their own."""
    if len(fns) == 1:
        with mode:
            fns[0](*operands)
        return

    def rest(*args):
        with _compat.pop_dispatch_mode():  # the outer count pushed ``mode``, and so will this
            upper_bound(mode, fns[1:], args)

    _compat.count_cond_flops(mode, fns[0], fns[1] if len(fns) == 2 else rest, operands)


def _without_grad(branch: Callable) -> Callable:
    def run(*args):
        with torch.no_grad():
            return branch(*args)

    return run


def _on_fake(counting, branch: Callable, label: str) -> Callable:
    """Return a run of ``branch`` on fake tensors, only for its count.

    A fake mode beneath the counting one makes new tensors fake. Each real tensor that
    a torch function gets, operand or closure, is replaced by a fake copy. So nothing
    real is read or written. A branch that cannot run on fake tensors is not counted,
    and a warning says so.
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
    """Gives torch functions a fake copy of each real tensor, the same copy each time."""

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
