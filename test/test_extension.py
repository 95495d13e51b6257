"""The C++ extension torchcond._C is built and registers the torchcond library."""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

import torchcond


def test_library_is_registered_with_the_current_abi():
    # The library's ABI is the one this checkout's Python expects (_extension.py).
    assert torch.ops.torchcond.abi_version() == torchcond._extension.ABI_VERSION


def test_select_operators_run_on_every_registered_device():
    import torchcond._src.select_ops  # noqa: F401  (fake/autograd/vmap rules)

    ops = torch.ops.torchcond
    devices = ["cpu", "meta"]
    if ops.built_with_cuda() and torch.cuda.is_available():
        devices.append("cuda")
    for device in devices:
        t = torch.ones(2, 3, device=device)
        f = torch.zeros(2, 3, device=device)
        pred = torch.tensor([True, False], device=device)
        (out,) = ops.select(pred, [t], [f])
        (out_n,) = ops.select_n(torch.tensor(1, device=device), [t, f], 2)
        assert out.shape == out_n.shape == (2, 3) and out.device.type == device
        if device != "meta":
            assert out.tolist() == [[1.0] * 3, [0.0] * 3] and out_n.tolist() == [[0.0] * 3] * 2


def test_test_only_ops_are_not_in_the_library():
    # the CUDA kernel's CPU emulation is a test extension (test/cuda_emulation.py)
    assert not hasattr(torch.ops.torchcond, "_select_cuda_emulated")
    assert {"_check_select", "_check_select_n"} <= set(dir(torchcond._C))


def test_cuda_kernels_are_built_exactly_when_torch_has_cuda():
    built = torch.ops.torchcond.built_with_cuda()
    assert isinstance(built, bool)
    if torch.version.cuda is None:
        assert built is False


def test_extension_module_is_importable():
    import torchcond._C as ext

    assert ext.__name__ == "torchcond._C"
    assert torchcond.__version__


def test_build_record_matches_the_running_torch():
    from torchcond import _extension

    built = _extension.read_build_info()
    assert built["torch"] == torch.__version__
    assert built["torch_cuda"] == torch.version.cuda
    assert built["with_cuda"] == torch.ops.torchcond.built_with_cuda()
    assert _extension.mismatch(built, torch.__version__, torch.version.cuda) is None


def test_mismatch_names_both_builds_and_the_fix():
    from torchcond._extension import mismatch

    cpu_213 = {"torch": "2.13.0+cpu", "torch_cuda": None, "with_cuda": False}
    cuda_214 = {"torch": "2.14.1+cu130", "torch_cuda": "13.0", "with_cuda": True}
    why = mismatch(cpu_213, "2.14.1+cu130", "13.0")
    assert "built for torch 2.13.0+cpu (CPU only)" in why
    assert "torch 2.14.1+cu130 (CUDA 13.0) is running" in why
    assert "pip install --no-build-isolation" in why and "\n" not in why
    # CUDA kernels need the CUDA runtime they were compiled against.
    assert "built with CUDA kernels" in mismatch(cuda_214, "2.14.1+cpu", None)
    assert "CUDA 13.0" in mismatch(cuda_214, "2.14.1+cu128", "12.8")
    # A CPU-only library runs under a CUDA torch of the same release (a warning says
    # the CUDA kernels are missing), and a local tag alone is no mismatch.
    assert mismatch(cpu_213, "2.13.0+cu130", "13.0") is None
    assert mismatch(cuda_214, "2.14.1", "13.0") is None


def test_import_under_another_torch_explains_instead_of_crashing():
    import subprocess
    import sys

    code = "import torch; torch.__version__ = '2.99.0'; import torchcond"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: torchcond._C was built for torch ")
    assert "but torch 2.99.0" in last and "rebuild it against this torch" in last


# --- one libstdc++: _C links the shared runtime torch loads (tools/check_libstdcxx.py) ---

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "check_libstdcxx", ROOT / "tools" / "check_libstdcxx.py"
)
check_libstdcxx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_libstdcxx)

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads ELF libraries; libstdc++ is Linux's"
)
# A select argument error whose message formats numbers through std::ostream: with a
# private libstdc++ in _C it stopped at "true_values has " or killed the process.
PAIRING_ERROR = (
    "import torch, torchcond\n"
    "t, f = torch.ones(3), torch.zeros(3)\n"
    "try:\n"
    "    torchcond.select(torch.tensor([True, False, True]), [t, t], [f])\n"
    "except torchcond.CondArgumentError as e:\n"
    "    print(torchcond._C.__file__)\n"
    "    print(e)\n"
)


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler (c++, g++ or $CXX) on PATH")
    return cxx


@linux_only
def test_c_links_the_shared_libstdcxx_and_defines_none_of_it():
    library = torchcond._C.__file__
    assert check_libstdcxx.problem(library) is None
    assert "libstdc++.so.6" in check_libstdcxx.needed(library)
    # std::string members are weak copies that _C's own code emits: not libstdc++'s.
    defined = {n for n, d in check_libstdcxx.dynamic_symbols(library) if d}
    assert any(n.startswith("_ZN9torchcond") for n in defined)


@linux_only
def test_the_check_finds_a_private_libstdcxx(tmp_path):
    # The check must be able to fail: a library linked with -static-libstdc++ that
    # formats a number, as TORCH_CHECK does, is caught by the symbol that formats it.
    source = tmp_path / "probe.cpp"
    source.write_text(
        "#include <sstream>\n#include <string>\n"
        'std::string probe(unsigned long n) { std::ostringstream os; os << "has " << n; '
        "return os.str(); }\n"
    )
    cxx = _compiler()
    for name, flags in (("static", ["-static-libstdc++"]), ("shared", [])):
        out = tmp_path / f"probe_{name}.so"
        subprocess.run(
            [cxx, "-O2", "-fPIC", "-shared", *flags, str(source), "-o", str(out)], check=True
        )
    static = check_libstdcxx.problem(str(tmp_path / "probe_static.so"))
    assert static.startswith("it defines ") and "_ZNSo9_M_insertImEERSoT_" in static
    assert check_libstdcxx.problem(str(tmp_path / "probe_shared.so")) is None
    with pytest.raises(check_libstdcxx.NotElf, match="is not an ELF file"):
        check_libstdcxx.problem(str(source))


def _build(tmp_path, ldflags: str) -> subprocess.CompletedProcess:
    """setup.py build_ext into tmp_path/lib, CPU only, with these LDFLAGS.

    The object files are the in-place build's (build/temp.*/torch-<version>-cpu): the
    compile commands do not change with LDFLAGS, so ninja only relinks (seconds), and
    the in-place library stays as it is."""
    env = {**os.environ, "LDFLAGS": ldflags, "TORCHCOND_CUDA": "0"}
    return subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


def _package_with(tmp_path, built: pathlib.Path) -> pathlib.Path:
    """A copy of the torchcond package around the library just built."""
    root = tmp_path / "site"
    shutil.copytree(
        ROOT / "torchcond",
        root / "torchcond",
        ignore=shutil.ignore_patterns("*.so", "_build_info.json", "__pycache__"),
    )
    for path in built.iterdir():
        shutil.copy(path, root / "torchcond" / path.name)
    return root


def _pairing_error(site: pathlib.Path) -> list[str]:
    """The library's path and the error's message, from a fresh process importing the
    torchcond package in ``site``."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run(
        [sys.executable, "-c", PAIRING_ERROR], cwd=site, capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def _is_the_clear_failure(proc) -> bool:
    lines = proc.stderr.strip().splitlines()
    return (
        proc.returncode != 0
        and bool(lines)
        and lines[-1].startswith("torchcond._C would carry its own copy of libstdc++ (it ")
    )


@linux_only
def test_a_static_libstdcxx_request_gives_a_sound_library_or_a_clear_failure(tmp_path):
    proc = _build(tmp_path, "-static-libstdc++")
    if _is_the_clear_failure(proc):  # a toolchain with libstdc++.a alone
        assert "then rebuild" in proc.stderr.strip().splitlines()[-1]
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = tmp_path / "lib" / "torchcond"
    (library,) = built.glob("_C*.so")
    assert check_libstdcxx.problem(str(library)) is None
    where, *message = _pairing_error(_package_with(tmp_path, built))
    assert where == str(tmp_path / "site" / "torchcond" / library.name)
    # The whole message, numbers included, as the in-place build gives it.
    assert message == _pairing_error(pathlib.Path(torchcond.__file__).parents[1])[1:]
    assert message[0].startswith("true_values has 2 tensors, false_values has 1; they must pair up")


@linux_only
def test_a_toolchain_with_only_the_static_libstdcxx_fails_the_build_in_one_line(tmp_path):
    archive = subprocess.run(
        [_compiler(), "-print-file-name=libstdc++.a"], capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isabs(archive):
        pytest.skip("this toolchain has no libstdc++.a to take")
    # ld looks in each -L folder for libstdc++.so, then libstdc++.a: a folder holding
    # the archive alone stands for a toolchain installed without the .so link.
    only = tmp_path / "static-only"
    only.mkdir()
    (only / "libstdc++.a").symlink_to(archive)
    proc = _build(tmp_path, f"-L{only}")
    assert _is_the_clear_failure(proc), proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "_ZNSo9_M_insertImEERSoT_" in last
    assert f"the linker took {only / 'libstdc++.a'} because no libstdc++.so" in last
    assert "LDFLAGS=-L<folder>" in last and last.endswith("then rebuild")
    # Nothing unsound is left behind for the next build to find up to date.
    assert not list((tmp_path / "lib").rglob("_C*.so"))
