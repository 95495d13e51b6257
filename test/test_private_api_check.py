"""tools/check_private_torch.py: private torch names are found however they are reached."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check", ROOT / "tools" / "check_private_torch.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


@pytest.mark.parametrize(
    "source, names",
    [
        (
            "import torch\nf = torch._C._len_torch_dispatch_stack",
            ["torch._C._len_torch_dispatch_stack"],
        ),
        ("import torch.utils._pytree as pytree", ["torch.utils._pytree"]),
        ("from torch.utils import _pytree", ["torch.utils._pytree"]),
        ("from torch._subclasses import FakeTensor", ["torch._subclasses.FakeTensor"]),
        ("import torch.fx as fx\nfx._symbolic_trace.Tracer", ["torch.fx._symbolic_trace.Tracer"]),
        ("from torch import fx\nx = fx.graph._Namespace", ["torch.fx.graph._Namespace"]),
        ("import torch\ntorch._dynamo.config.x = 1", ["torch._dynamo.config.x"]),
        # Public names, dunders, and other packages' private names are fine.
        ("import torch\ntorch.fx.GraphModule\ntorch.__version__", []),
        ("import numpy\nnumpy._core", []),
        ("from . import _compat\n_compat.pytree.tree_map", []),
        ("import torch\nx = torch.ones(1)\nx._version", []),
    ],
)
def test_finds_private_torch_names(source, names):
    assert [name for _, _, name in check.uses(source)] == names


def test_package_uses_private_torch_only_in_compat(capsys):
    assert check.main(["check", str(ROOT / "torchcond"), str(ROOT / "csrc")]) == 0, (
        capsys.readouterr().out
    )


def test_reports_a_use_outside_compat(tmp_path, capsys):
    pkg = tmp_path / "pkg"
    (pkg / "_compat").mkdir(parents=True)
    (pkg / "_compat" / "__init__.py").write_text("import torch\nf = torch._C._x\n")
    (pkg / "api.py").write_text("import torch\n\nf = torch._C._y\n")
    assert check.main(["check", str(pkg), str(ROOT / "csrc")]) == 1
    out = capsys.readouterr().out
    assert f"{pkg}/api.py:3:5: private torch API torch._C._y" in out
    assert "_compat/__init__.py" not in out


@pytest.mark.parametrize(
    "source, names",
    [
        ("def f(m):\n    return m._buffers", ["._buffers"]),
        ("def f(t):\n    return t._version + 1", ["._version"]),
        # torchcond's own private names, its extension's, and a named tuple's are fine.
        ("def _g():\n    pass\n\ndef f(m):\n    return m._g", []),
        ("from . import _C\n_C._check_select", []),
        ("def f(p):\n    return p._replace(x=1)", []),
    ],
)
def test_finds_private_attributes(source, names):
    defined = {"_g", "_C"}
    assert [name for _, _, name in check.private_attributes(source, defined)] == names


def test_reports_private_cpp_not_listed_and_listings_not_used(tmp_path, capsys):
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    for path in (ROOT / "csrc").rglob("*"):
        if path.suffix in (".cpp", ".h", ".cu", ".cuh"):
            (csrc / path.name).write_text(path.read_text())
    assert check.check_cpp(csrc) == 0, capsys.readouterr().out
    (csrc / "ops.cpp").write_text(
        (csrc / "ops.cpp").read_text() + "\nauto k = c10::impl::tls_local_dispatch_key_set();\n"
    )
    (csrc / "eager.cpp").write_text(
        (csrc / "eager.cpp").read_text().replace("torch::jit::tracer::isTracing", "false")
    )
    assert check.check_cpp(csrc) == 2
    out = capsys.readouterr().out
    assert "ops.cpp" in out and "private torch C++ c10::impl::tls_local_dispatch_key_set" in out
    assert "CPP_USES lists torch::jit::tracer::isTracing for eager, which no longer uses it" in out
