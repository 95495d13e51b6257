"""The test extension ``torchcond_testing``: the CUDA select kernel run on the CPU.

``test/csrc/select_cuda_emulation.cpp`` compiles ``csrc/cuda/select_kernel.cuh`` and
its launcher as plain C++ and runs the kernel one (block, thread) at a time, so the
kernel's indexing, tiling and packing are tested on machines without a GPU. It is
not part of torchcond (the wheel never holds it): the first test that needs it
compiles it with ``torch.utils.cpp_extension.load``, together with
``csrc/select_common.cpp`` (the argument checks and planning the kernels share), into
``build/test-ext/<torch build>/``. Later runs reuse that build unless a source
changed.
"""

from __future__ import annotations

import functools
import os

import torch
from torch.utils import cpp_extension

import torchcond  # noqa: F401  (the kernels' library, torch.ops.torchcond)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def emulation_ops():
    """``torch.ops.torchcond_testing``, built and loaded on first use."""
    tag = f"torch-{torch.__version__}".replace("+", "_")
    build = os.path.join(ROOT, "build", "test-ext", tag)
    os.makedirs(build, exist_ok=True)
    cpp_extension.load(
        name="torchcond_testing",
        sources=[
            os.path.join(ROOT, "test", "csrc", "select_cuda_emulation.cpp"),
            os.path.join(ROOT, "csrc", "select_common.cpp"),
        ],
        extra_include_paths=[os.path.join(ROOT, "csrc")],
        extra_cflags=["-O2"],
        build_directory=build,
        is_python_module=False,
        with_cuda=False,
    )
    return torch.ops.torchcond_testing
