"""The C++ extension torchcond._C is built and registers the torchcond library."""

import torch

import torchcond


def test_library_is_registered_with_the_current_abi():
    assert torch.ops.torchcond.abi_version() == 3


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
