"""The C++ extension torchcond._C is built and registers the torchcond library."""

import torch

import torchcond


def test_library_is_registered_with_the_current_abi():
    assert torch.ops.torchcond.abi_version() == 1


def test_cuda_kernels_are_built_exactly_when_torch_has_cuda():
    built = torch.ops.torchcond.built_with_cuda()
    assert isinstance(built, bool)
    if torch.version.cuda is None:
        assert built is False


def test_extension_module_is_importable():
    import torchcond._C as ext

    assert ext.__name__ == "torchcond._C"
    assert torchcond.__version__
