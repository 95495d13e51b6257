"""Load torchcond._C after checking that it was built for the running torch.

The extension links against torch's C++ libraries. Their ABI changes between torch
releases and between CPU and CUDA builds. The build records what it compiled against
in ``_build_info.json`` beside the library (see setup.py). This module compares that
record with the running torch *before* it loads the library. A mismatch then gives a
one-line explanation with the fix, instead of an undefined-symbol error or a later crash.
"""

from __future__ import annotations

import json
import os
import warnings

import torch

# Bump this with every change to the operators' schemas or torchcond._C's functions.
# It must match kAbiVersion in csrc/ops.cpp.
ABI_VERSION = 6

_HERE = os.path.dirname(os.path.abspath(__file__))
_REBUILD = (
    "rebuild it against this torch: `pip install --no-build-isolation -e .` in a checkout, "
    "or `pip install --no-build-isolation --force-reinstall --no-deps torchcond` for a release"
)


def _release(version: str) -> str:
    """Drop the local tag, so '2.14.1+cu130' becomes '2.14.1'. The tag names the build,
    which ``mismatch`` checks separately."""
    return version.split("+")[0]


def _describe(torch_version: str, cuda: str | None) -> str:
    return f"torch {torch_version} ({'CUDA ' + cuda if cuda else 'CPU only'})"


def mismatch(built: dict, torch_version: str, torch_cuda: str | None) -> str | None:
    """Why a library built as ``built`` cannot run under this torch, or None if it can."""
    built_for = _describe(built["torch"], built["torch_cuda"])
    running = _describe(torch_version, torch_cuda)
    if _release(built["torch"]) != _release(torch_version):
        return f"torchcond._C was built for {built_for}, but {running} is running; {_REBUILD}"
    if built["with_cuda"] and built["torch_cuda"] != torch_cuda:
        return (
            f"torchcond._C was built with CUDA kernels for {built_for}, but {running} is "
            f"running; {_REBUILD}"
        )
    return None


def read_build_info() -> dict | None:
    try:
        with open(os.path.join(_HERE, "_build_info.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def load() -> None:
    """Check the build record, then import torchcond._C to register its operators."""
    built = read_build_info()
    if built is None:
        raise ImportError(
            "torchcond's C++ extension is not built (no torchcond/_build_info.json beside "
            f"it in {_HERE}); {_REBUILD}"
        )
    why = mismatch(built, torch.__version__, torch.version.cuda)
    if why is not None:
        raise ImportError(why)
    try:
        from . import _C  # noqa: F401
    except ImportError as e:
        raise ImportError(f"torchcond._C does not load ({e}); {_REBUILD}") from None
    abi = torch.ops.torchcond.abi_version()
    if abi != ABI_VERSION:
        raise ImportError(
            f"torchcond._C has operator ABI {abi}, but this torchcond's Python code "
            f"expects {ABI_VERSION}: the library is left from another checkout; {_REBUILD}"
        )
    if torch.version.cuda is not None and not built["with_cuda"]:
        warnings.warn(
            f"torchcond._C was built without CUDA kernels, but {_describe(torch.__version__, torch.version.cuda)} "
            "is running: torchcond.select/select_n will fail on CUDA tensors. Rebuild with "
            "nvcc on PATH (or CUDA_HOME set), or TORCHCOND_CUDA=1 to make that an error.",
            RuntimeWarning,
            stacklevel=3,
        )
