"""Export patterns for ``torchcond.cond`` and ``torchcond.switch``, one module each.

Every example module defines ``Model`` (an ``nn.Module`` whose ``forward`` uses
``cond`` or ``switch``), ``example_args``, ``dynamic_shapes`` (for
``torch.export.export``) and ``branch_inputs`` (inputs reaching every branch).
The cond examples mirror the cond entries of PyTorch's ExportDB; the rest are ours.
"""

import importlib
import pkgutil

#: Example name (the module's short name) -> example module, sorted by name.
EXAMPLES = {
    info.name: importlib.import_module(f"{__name__}.{info.name}")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name)
}

__all__ = ["EXAMPLES"]
