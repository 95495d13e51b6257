"""Whether the host can read a conditional's selector now.

One rule serves every caller, and ``host_readable``'s ``asker`` says which caller
asks. The eager fast path keeps a copy of the ``PLAIN`` rule in C for speed
(``api.py``, ``csrc/eager.cpp``). test_host_readable.py checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import _compat

# Who asks. PLAIN is a rule with no mode above it, such as api's slow path or the
# Autograd, DTensor and functionalization rules. Under any dispatch mode, PLAIN reads
# nothing, because the mode decides instead. UNDER_MODE is a rule of modes.py, beneath
# a mode that traces nothing. TRANSFORM is torch.func's rule. Its selector may be a
# transform's wrapper.
PLAIN, UNDER_MODE, TRANSFORM = "plain", "under a mode", "transform"

# Tensor subclasses whose value the host can read, with the same value in every
# process that runs the program. Each type maps to a test of whether one of its tensors
# can be read. distributed.py adds DTensor (readable when replicated) once
# torch.distributed.tensor is imported.
HOST_READABLE: dict[type, Callable[[torch.Tensor], bool]] = {}


def host_readable(selector, asker: str = PLAIN, op=None) -> bool:
    """Whether the host can read ``selector`` now, as ``asker`` sees it.
    ``op`` is the conditional, and every asker but ``PLAIN`` needs it. The answer is
    False under a mode that traces, a pre-dispatch trace, or dynamo. Reading the
    selector there would inline one branch into the trace."""
    if not _nothing_traces(asker, op):
        return False
    if isinstance(selector, torch.Tensor):
        return _tensor_readable(selector, asker)
    return isinstance(selector, int)  # a bool too; not a SymInt or SymBool


def traces(op, mode) -> bool:
    """Whether ``mode`` has a rule of ours for ``op``, as torch's fake, proxy and
    functional modes do. A subclass of such a mode counts too. torch's lookup misses
    the subclass, and we leave it to torch."""
    cls = type(mode)
    if cls is _compat.FlopCounterDispatchMode:
        return False
    return any(base in op.python_key_table for base in cls.__mro__)


def _nothing_traces(asker: str, op) -> bool:
    if asker == PLAIN:  # three C-level checks, since this runs on every slow eager call
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
    # Use a subclass's own rule only with no mode at all. Beneath a mode that traces
    # nothing, the mode steps aside first, and the subclass's rule reads the tensor then.
    if subclass_rule is not None and asker != UNDER_MODE and not _compat.len_dispatch_stack():
        return subclass_rule(t)
    return type(t) is torch.Tensor and t.device.type != "meta"
