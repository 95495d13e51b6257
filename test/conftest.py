"""Settings every test module shares.

``TORCHCOND_SKIP_MISSING=1`` is for machines where nothing can be installed (``make
gpu-check`` sets it): a test module that imports a test dependency from
requirements-dev.txt that cannot be imported is skipped, naming the package, instead
of failing the whole run. Without it a missing dependency fails collection, as it
must in CI, where requirements-dev.txt is installed.
"""

from __future__ import annotations

import ast
import gc
import importlib
import os
import pathlib
import re
import sys
import warnings

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
    }


def buffer_hooks() -> dict:
    """torch's global buffer registration hooks (``register_module_buffer_registration_hook``)."""
    from torch.nn.modules import module

    return module._global_buffer_registration_hooks


def dispatch_keys() -> tuple[frozenset, frozenset]:
    """The thread's locally included and excluded dispatch keys."""
    import torch

    c, included, excluded = torch._C, set(), set()
    for key in c.DispatchKey.__members__.values():
        try:
            if c._dispatch_tls_is_dispatch_key_included(key):
                included.add(key)
            if c._dispatch_tls_is_dispatch_key_excluded(key):
                excluded.add(key)
        except RuntimeError:  # an alias key, which the thread state does not hold
            continue
    return frozenset(included), frozenset(excluded)


def restore_dispatch_keys(saved: tuple[frozenset, frozenset]) -> None:
    import torch

    now = dispatch_keys()
    for key in now[0] ^ saved[0]:
        torch._C._dispatch_tls_set_dispatch_key_included(key, key in saved[0])
    for key in now[1] ^ saved[1]:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, key in saved[1])


def dynamo_frames() -> int:
    """How many frames dynamo has begun to compile in this process."""
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


# Tests since the collector last saw every object (see torch_state_unchanged).
_FROZEN_TESTS = [0]
# How many tests may run between two collections of everything.
_UNFREEZE_EVERY = 50


def _freeze_what_is_alive() -> None:
    """Leave the objects alive now out of later collections (``gc.freeze``), so that a
    collection sees only what the next test makes. With torch, dynamo and Inductor
    loaded, a collection of everything takes about 0.2 s, most of a short test's time.
    Every ``_UNFREEZE_EVERY`` tests everything is collected once, which frees the
    cycles that objects frozen earlier have since left; the dispatch keys are put back
    after it, as after a test (see torch_state_unchanged)."""
    _FROZEN_TESTS[0] += 1
    if _FROZEN_TESTS[0] >= _UNFREEZE_EVERY:
        _FROZEN_TESTS[0] = 0
        keys = dispatch_keys()
        gc.unfreeze()
        gc.collect()
        restore_dispatch_keys(keys)
    gc.freeze()


@pytest.fixture(autouse=True)
def torch_state_unchanged():
    """Fails the test that leaves torch's thread state changed, instead of every later
    test in its process.

    A test that ran dynamo is followed by a garbage collection. On torch 2.14 dynamo
    formats fake-tensor errors with ``Tensor.__repr__``, whose frame holds a
    ``_DisableFuncTorch`` guard; kept by the error's traceback, the guard puts back
    stale dispatch keys whenever the collector frees it, in whatever test then runs.
    Collected here, that happens between tests, and the keys are put back. What was
    alive before the test is left out of that collection (``_freeze_what_is_alive``)."""
    if "torch" not in sys.modules:
        yield
        return
    _freeze_what_is_alive()
    before, keys, frames = torch_global_state(), dispatch_keys(), dynamo_frames()
    hooks = dict(buffer_hooks())
    yield
    if dynamo_frames() != frames:
        gc.collect()
    leaked = {k: h for k, h in buffer_hooks().items() if k not in hooks}
    for k, hook in leaked.items():
        if getattr(hook, "__name__", "") == "_map_assigned_buffer_to_proxy":
            # torch 2.11's non-strict export leaves this hook registered when the export
            # raises (a refused program, here). It sends later eager calls to the
            # general path, which a test of the one-call path would see.
            del buffer_hooks()[k]
        else:
            pytest.fail(f"the test left a global buffer registration hook: {hook!r}")
    if dispatch_keys() != keys:
        restore_dispatch_keys(keys)
        warnings.warn("the test left torch's dispatch keys changed; put back", stacklevel=1)
    after = torch_global_state()
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    if changed:
        pytest.fail(f"the test left torch's state changed (before, after): {changed}")
