"""Run a callback once a module is imported, without importing it ourselves.

Dynamo and Inductor take most of a second to import. torchcond registers its hooks
into them only when the user's program loads them (see ``dynamo.py``, ``inductor.py``).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` now if ``name`` is loaded, or right after it loads."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` once ``name`` is imported, then removes itself."""

    def __init__(self, name, callback):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_register(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_register
        return spec
