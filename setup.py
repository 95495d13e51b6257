"""Build torchcond and its extension torchcond._C.

CPU sources (csrc/*.cpp, csrc/cpu/*.cpp) are always built. CUDA sources
(csrc/cuda/*.cu, except the *_check.cu translation units that `make cuda-check`
compiles on their own) are added when torch was built with CUDA and nvcc is found;
TORCHCOND_CUDA=0 or 1 overrides that choice.

The CPU kernels use at::parallel_for, which is inlined from torch's headers: with
torch's OpenMP backend it runs in parallel only when the extension is compiled with
-fopenmp (without it, it silently runs on one thread), so -fopenmp is added when
torch uses OpenMP and the compiler accepts it.

Install with: pip install --no-build-isolation -e .
(no build isolation, so pip uses the torch already installed instead of fetching one)
"""

import glob
import os
import sys

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


def _openmp_flags() -> list[str]:
    """-fopenmp when torch's intra-op backend is OpenMP and the compiler takes it."""
    if "OpenMP" not in torch.__config__.parallel_info().split("ATen parallel backend:")[-1]:
        return []
    if sys.platform != "linux":  # macOS clang has no -fopenmp by default
        return []
    return ["-fopenmp"]


def _extension():
    os.chdir(ROOT)
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
    omp = _openmp_flags()
    cxx = ["-O3", "-std=c++17", *omp]
    # At run time libgomp.so.1 is the copy torch already loaded (same soname).
    link = list(omp)
    if not _want_cuda():
        return CppExtension(
            "torchcond._C", sources, extra_compile_args={"cxx": cxx}, extra_link_args=link
        )
    sources += sorted(f for f in glob.glob("csrc/cuda/*.cu") if not f.endswith("_check.cu"))
    return CUDAExtension(
        "torchcond._C",
        sources,
        define_macros=[("TORCHCOND_WITH_CUDA", None)],
        extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "-std=c++17"]},
        extra_link_args=link,
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
