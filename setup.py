"""Build torchcond and its extension torchcond._C.

CPU sources (csrc/*.cpp, csrc/cpu/*.cpp) are always built. CUDA sources
(csrc/cuda/*.cu) are added when torch was built with CUDA and nvcc is found;
TORCHCOND_CUDA=0 or 1 overrides that choice.

Install with: pip install --no-build-isolation -e .
(no build isolation, so pip uses the torch already installed instead of fetching one)
"""

import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

import torch

ROOT = os.path.dirname(os.path.abspath(__file__))


def _want_cuda() -> bool:
    forced = os.environ.get("TORCHCOND_CUDA")
    if forced not in (None, "0", "1"):
        raise SystemExit(f"TORCHCOND_CUDA must be 0 or 1; found {forced!r}")
    if forced == "0":
        return False
    if forced == "1":
        if torch.version.cuda is None:
            raise SystemExit(
                f"TORCHCOND_CUDA=1 needs a CUDA build of torch; found torch {torch.__version__} "
                "(CPU only). Install a CUDA torch, or unset TORCHCOND_CUDA."
            )
        if CUDA_HOME is None:
            raise SystemExit("TORCHCOND_CUDA=1 but no CUDA toolkit was found: set CUDA_HOME")
        return True
    return torch.version.cuda is not None and CUDA_HOME is not None


def _extension():
    os.chdir(ROOT)
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
    cxx = ["-O3", "-std=c++17"]
    if not _want_cuda():
        return CppExtension("torchcond._C", sources, extra_compile_args={"cxx": cxx})
    sources += sorted(glob.glob("csrc/cuda/*.cu"))
    return CUDAExtension(
        "torchcond._C",
        sources,
        define_macros=[("TORCHCOND_WITH_CUDA", None)],
        extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "-std=c++17"]},
    )


setup(
    name="torchcond",
    version="0.1.0",
    description="Structured conditionals (cond, switch) for PyTorch as higher-order operators",
    packages=find_packages(include=["torchcond", "torchcond.*"]),
    python_requires=">=3.11",
    install_requires=["torch>=2.11"],
    extras_require={
        "test": ["pytest", "expecttest", "hypothesis", "numpy"],
        "docs": ["sphinx"],
    },
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
    zip_safe=False,
)
