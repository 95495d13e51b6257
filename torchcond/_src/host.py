"""Whether the host can read a conditional's selector now: one rule for every
situation that asks (``host_readable``'s ``asker``).

The eager fast path keeps a copy of the ``PLAIN`` rule in C, for speed (``api.py``,
``csrc/eager.cpp``); test_host_readable.py checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import _compat

# Who asks. PLAIN: a rule no mode stands above (api's slow path, the Autograd,
# DTensor and functionalization rules): any dispatch mode decides in its place.
# UNDER_MODE: the rules of modes.py, beneath a mode that traces nothing.
# TRANSFORM: torch.func's rule, whose selector may be a transform's wrapper.
PLAIN, UNDER_MODE, TRANSFORM = "plain", "under a mode", "transform"

# Tensor subclasses whose value can be read on the host, the same in every process
# that runs the program: {type: whether a tensor of it can be read}. distributed.py
# adds DTensor (a replicated one) once torch.distributed.tensor is imported.
HOST_READABLE: dict[type, Callable[[torch.Tensor], bool]] = {}


def host_readable(selector, asker: str = PLAIN, op=None) -> bool:
    """The host can read ``selector`` now, as ``asker`` sees it; ``op`` is the
    conditional, needed by every asker but ``PLAIN``.

    Never under a mode that traces, a pre-dispatch trace or dynamo: reading the
    selector there would inline one branch into the trace.
    """
    if not _nothing_traces(asker, op):
        return False
    if isinstance(selector, torch.Tensor):
        return _tensor_readable(selector, asker)
    return isinstance(selector, int)  # a bool too; not a SymInt or SymBool


def traces(op, mode) -> bool:
    """``mode`` has a rule of ours for ``op`` (torch's fake, proxy and functional
    modes), or is a subclass of one (torch's lookup misses it: left to torch)."""
    cls = type(mode)
    if cls is _compat.FlopCounterDispatchMode:
        return False
    return any(base in op.python_key_table for base in cls.__mro__)


def _nothing_traces(asker: str, op) -> bool:
    if asker == PLAIN:  # three C-level checks: this runs on every slow eager call
        return not _compat.tracing_active()
    if _compat.is_dynamo_compiling() or _compat.pre_dispatch_tracing():
        return False
    return not any(traces(op, mode) for mode in _compat.dispatch_mode_stack())


def _tensor_readable(t: torch.Tensor, asker: str) -> bool:
    if _compat.is_functorch_wrapped(t):
        # Beneath a mode, torch.func's own rule decides (it asks as TRANSFORM).
        if asker == UNDER_MODE or _compat.is_vmapped(t):
            return False
        t = _compat.functorch_base(t)
    subclass_rule = HOST_READABLE.get(type(t))
    # A subclass's own rule only with no mode at all: beneath a mode that traces
    # nothing, the mode steps aside first and the subclass's rule then reads it.
    if subclass_rule is not None and asker != UNDER_MODE and not _compat.len_dispatch_stack():
        return subclass_rule(t)
    return type(t) is torch.Tensor and t.device.type != "meta"
