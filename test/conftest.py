"""Settings every test module shares.

``TORCHCOND_SKIP_MISSING=1`` is for machines where nothing can be installed (``make
gpu-check`` sets it): a test module that imports a test dependency from
requirements-dev.txt that cannot be imported is skipped, naming the package, instead
of failing the whole run. Without it a missing dependency fails collection, as it
must in CI, where requirements-dev.txt is installed.
"""

from __future__ import annotations

import ast
import importlib
import os
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def dev_requirements() -> set[str]:
    """The module names of requirements-dev.txt (each matches its distribution name)."""
    names = set()
    for line in (ROOT / "requirements-dev.txt").read_text().splitlines():
        found = re.match(r"\s*([A-Za-z0-9_.-]+)", line.split("#")[0])
        if found:
            names.add(found.group(1).lower().replace("-", "_"))
    return names


def top_level_imports(path: pathlib.Path) -> set[str]:
    """The packages a module imports as it loads (not those imported inside functions)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def unimportable(names) -> dict[str, str]:
    """name -> why it cannot be imported, for those of ``names`` that cannot."""
    why = {}
    for name in sorted(names):
        try:
            importlib.import_module(name)
        except ImportError as e:
            why[name] = "not installed" if isinstance(e, ModuleNotFoundError) else str(e)
    return why


class MissingDependency(pytest.Module):
    """A test module whose dependencies cannot be imported: skipped as a whole."""

    reason = ""

    def collect(self):
        pytest.skip(self.reason)


def pytest_pycollect_makemodule(module_path, parent):
    if os.environ.get("TORCHCOND_SKIP_MISSING") != "1":
        return None
    missing = unimportable(top_level_imports(module_path) & dev_requirements())
    if not missing:
        return None
    module = MissingDependency.from_parent(parent, path=module_path)
    needs = ", ".join(f"{n} ({why})" for n, why in missing.items())
    module.reason = f"{module_path.name} needs {needs}; skipped as TORCHCOND_SKIP_MISSING=1"
    return module


def torch_global_state() -> dict[str, object]:
    """The parts of torch's thread state a test can leave changed by mistake."""
    import torch

    c = torch._C
    return {
        "grad mode": torch.is_grad_enabled(),
        "inference mode": torch.is_inference_mode_enabled(),
        "forward-AD mode": c._is_fwd_grad_enabled(),
        "torch.func levels": c._functorch.get_dynamic_layer_stack_depth(),
        "dispatch modes": c._len_torch_dispatch_stack(),
        "torch function modes": c._len_torch_function_stack(),
        "torch function enabled": c._is_torch_function_enabled(),
        "dispatch keys included": str(c._dispatch_tls_local_include_set()),
        "dispatch keys excluded": str(c._dispatch_tls_local_exclude_set()),
    }


@pytest.fixture(autouse=True)
def torch_state_unchanged():
    """Fails the test that leaves torch's thread state changed, instead of every later
    test in its process."""
    if "torch" not in sys.modules:
        yield
        return
    before = torch_global_state()
    yield
    after = torch_global_state()
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    if changed:
        pytest.fail(f"the test left torch's state changed (before, after): {changed}")
