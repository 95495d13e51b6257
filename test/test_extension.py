"""The C++ extension torchcond._C is built and registers the torchcond library."""

import torch

import torchcond


def test_library_is_registered_with_the_current_abi():
    assert torch.ops.torchcond.abi_version() == 2


def test_select_operators_run_on_every_registered_device():
    import torchcond.select_rules  # noqa: F401  (fake/autograd/vmap rules)

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


def test_cuda_kernels_are_built_exactly_when_torch_has_cuda():
    built = torch.ops.torchcond.built_with_cuda()
    assert isinstance(built, bool)
    if torch.version.cuda is None:
        assert built is False


def test_extension_module_is_importable():
    import torchcond._C as ext

    assert ext.__name__ == "torchcond._C"
    assert torchcond.__version__
