"""Every ExportDB-style example exports, survives save/load, and matches eager on every branch."""

from __future__ import annotations

import importlib.util
import io
import os
import sys
import warnings

import pytest
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import torchcond  # noqa: E402,F401  (registers the operators before any load)
from exportdb_examples import EXAMPLES  # noqa: E402

NAMES = list(EXAMPLES)
CONDITIONAL_OPS = {"torchcond_cond", "torchcond_switch"}
# Examples whose graph holds more than one conditional (nested or side by side).
MIN_CONDITIONALS = {"nested_cond": 2, "sibling_conds": 2}


def _make_model(example) -> torch.nn.Module:
    torch.manual_seed(0)
    return example.Model().eval()


def _export(example, model, strict: bool):
    with warnings.catch_warnings():
        # The warning cond/switch give when a Python-constant selector inlines one branch.
        warnings.filterwarnings("error", message=r".*is the Python constant.*")
        return torch.export.export(
            model, example.example_args, dynamic_shapes=example.dynamic_shapes, strict=strict
        )


def _round_trip(ep):
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    return torch.export.load(buf)


def _count_conditionals(gm: torch.fx.GraphModule) -> int:
    """Conditional nodes in ``gm`` and every subgraph it owns (nested branches included)."""
    return sum(
        1
        for mod in gm.modules()
        if isinstance(mod, torch.fx.GraphModule)
        for node in mod.graph.nodes
        if node.op == "call_function" and getattr(node.target, "__name__", None) in CONDITIONAL_OPS
    )


def _check_example(name: str, strict: bool) -> None:
    example = EXAMPLES[name]
    model = _make_model(example)
    ep = _export(example, model, strict)

    top_level = [
        n
        for n in ep.graph.nodes
        if n.op == "call_function" and getattr(n.target, "__name__", None) in CONDITIONAL_OPS
    ]
    assert top_level, f"{name}: no torchcond_cond/torchcond_switch node in the exported graph"
    assert _count_conditionals(ep.graph_module) >= MIN_CONDITIONALS.get(name, 1)

    loaded = _round_trip(ep)
    assert _count_conditionals(loaded.graph_module) == _count_conditionals(ep.graph_module)
    exported = loaded.module()
    assert example.branch_inputs, f"{name}: branch_inputs is empty"
    for i, inputs in enumerate(example.branch_inputs):
        with torch.no_grad():
            expected = model(*inputs)
            actual = exported(*inputs)
        torch.testing.assert_close(
            actual, expected, msg=lambda m, i=i: f"{name} branch_inputs[{i}]: {m}"
        )


def test_examples_registered():
    assert NAMES == sorted(NAMES)
    assert len(NAMES) >= 13
    for name, example in EXAMPLES.items():
        assert example.__doc__ and example.__doc__.strip(), name
        assert issubclass(example.Model, torch.nn.Module), name
        assert isinstance(example.example_args, tuple), name
        assert isinstance(example.branch_inputs, list), name


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_export_non_strict(name):
    _check_example(name, strict=False)


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_export_strict(name):
    _check_example(name, strict=True)


def _load_gen_gallery():
    path = os.path.join(REPO_ROOT, "docs", "gen_gallery.py")
    spec = importlib.util.spec_from_file_location("gen_gallery", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gallery_render_is_idempotent(tmp_path):
    gen_gallery = _load_gen_gallery()
    out = tmp_path / "gallery"
    paths = gen_gallery.render(str(out))
    assert sorted(os.path.basename(p) for p in paths) == sorted(
        [f"{n}.rst" for n in NAMES] + ["index.rst"]
    )
    first = {p: open(p, encoding="utf-8").read() for p in paths}
    assert gen_gallery.render(str(out)) == paths
    assert {p: open(p, encoding="utf-8").read() for p in paths} == first
    index = first[str(out / "index.rst")]
    for name in NAMES:
        page = first[str(out / f"{name}.rst")]
        assert f"   {name}" in index
        assert ".. literalinclude::" in page and "torch.ops.higher_order.torchcond_" in page
        graph = page.split(".. code-block:: python", 1)[1]
        assert "# File: exportdb_examples/" in graph
        assert REPO_ROOT not in graph and "# File: /" not in graph and " at 0x" not in graph
