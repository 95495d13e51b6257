"""Build torchcond and its extension torchcond._C.

CPU sources (csrc/*.cpp, csrc/cpu/*.cpp) are always built. CUDA sources
(csrc/cuda/*.cu, except the *_check.cu translation units that `make cuda-check`
compiles on their own) are added when torch was built with CUDA and nvcc is found;
TORCHCOND_CUDA=0 or 1 overrides that choice.

The CPU kernels use at::parallel_for, which is inlined from torch's headers: with
torch's OpenMP backend it runs in parallel only when the extension is compiled with
-fopenmp (without it, it silently runs on one thread), so -fopenmp is added when
torch uses OpenMP and the compiler accepts it.

The C++ standard is the one the installed torch's headers need (C++17 up to torch
2.12, C++20 from 2.13): torch.utils.cpp_extension adds it, so no -std flag is set here.

The build writes torchcond/_build_info.json next to the extension: the torch and CUDA
versions it compiled against. `import torchcond` compares them with the running torch
(torchcond/_extension.py) and explains a mismatch instead of failing on a symbol.
Object files go to a build folder per torch build, and a change of torch relinks, so
one checkout can be rebuilt for each torch in turn.

_C links the shared libstdc++, the copy torch and Python already loaded, whatever the
toolchain asks for: see BuildExt._link_shared_runtime and docs/developer.rst.

Install with: pip install --no-build-isolation -e .
(no build isolation, so pip uses the torch already installed instead of fetching one)
"""

import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _cuda_home_from_nvcc() -> None:
    """Point CUDA_HOME at the toolkit when nvcc on PATH is a wrapper outside it.

    torch.utils.cpp_extension takes CUDA_HOME as the folder above `which nvcc`; for a
    wrapper script such as /usr/local/bin/nvcc that is /usr/local, where neither
    cuda_runtime.h nor libcudart lives, and the link fails (-lcudart). Must run
    before torch.utils.cpp_extension is imported, which reads CUDA_HOME once.
    """
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return
    guess = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    if os.path.exists(os.path.join(guess, "include", "cuda_runtime.h")):
        return
    for home in ("/usr/local/cuda",):
        if os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            os.environ["CUDA_HOME"] = home
            return


_cuda_home_from_nvcc()

import torch  # noqa: E402
from torch.utils.cpp_extension import (  # noqa: E402
    CUDA_HOME,
    BuildExtension,
    CppExtension,
    CUDAExtension,
)


def _want_cuda() -> bool:
    forced = os.environ.get("TORCHCOND_CUDA") or None  # empty: unset
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


def _default_cuda_arch_list() -> None:
    """With no GPU visible, compile for the GPUs the installed torch itself was built for.

    torch.utils.cpp_extension derives the architectures from the visible GPUs when
    TORCH_CUDA_ARCH_LIST is unset, and fails (an empty list) on a machine without one.
    torch._C._cuda_getArchFlags() is what torch.cuda.get_arch_list() returns once a
    GPU is present (checked on torch 2.11, 2.13, 2.14 and 2.15).
    """
    if os.environ.get("TORCH_CUDA_ARCH_LIST") or torch.cuda.device_count() > 0:
        return
    flags = torch._C._cuda_getArchFlags().split()
    archs = [f"{int(f[3:]) // 10}.{int(f[3:]) % 10}" for f in flags if f.startswith("sm_")]
    if not archs:
        raise SystemExit(
            "no GPU is visible and torch lists no CUDA architectures: set "
            "TORCH_CUDA_ARCH_LIST (e.g. '8.0;9.0') or TORCHCOND_CUDA=0"
        )
    archs[-1] += "+PTX"
    os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)


WITH_CUDA = _want_cuda()
if WITH_CUDA:
    _default_cuda_arch_list()


def build_info() -> dict:
    """What the extension is compiled against; _extension.py reads it back at import."""
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "with_cuda": WITH_CUDA,
    }


def _extension():
    os.chdir(ROOT)
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
    headers = sorted(glob.glob("csrc/*.h") + glob.glob("csrc/*/*.h") + glob.glob("csrc/*/*.cuh"))
    omp = _openmp_flags()
    cxx = ["-O3", *omp]
    # Python's own flags add -g: debug info makes _C about 30 times larger and takes
    # about 40% of the compile time. Left out unless TORCHCOND_DEBUG=1.
    if os.environ.get("TORCHCOND_DEBUG", "0") != "1":
        cxx.append("-g0")
    # At run time libgomp.so.1 is the copy torch already loaded (same soname).
    link = list(omp)
    if not WITH_CUDA:
        return CppExtension(
            "torchcond._C",
            sources,
            depends=headers,
            extra_compile_args={"cxx": cxx},
            extra_link_args=link,
        )
    sources += sorted(f for f in glob.glob("csrc/cuda/*.cu") if not f.endswith("_check.cu"))
    return CUDAExtension(
        "torchcond._C",
        sources,
        depends=headers,
        define_macros=[("TORCHCOND_WITH_CUDA", None)],
        extra_compile_args={"cxx": cxx, "nvcc": ["-O3"]},
        extra_link_args=link,
    )


def _tool(name: str):
    """tools/<name>.py, which is no package (it ships in the sdist beside setup.py)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Why a build can carry its own libstdc++, and what happens then.
#
# torch's libraries and Python's C++ extensions all use the one libstdc++.so.6 the
# process loaded. A library linked with a private copy of libstdc++ brings a second
# set of its stream, locale and exception code; calls from _C then mix the two, and
# formatting a number in an error message (TORCH_CHECK streams its arguments) asks a
# locale built by one copy for a facet registered by the other. The stream fails and
# the message stops where the first number goes (seen with gcc 12), or the process
# dies in libstdc++'s locale code (gcc 13). A build gets a private copy when:
#   * the link asks for it: -static-libstdc++ (or -static-libgcc) in LDFLAGS, CFLAGS,
#     CXXFLAGS or CPPFLAGS, or in LDSHARED/LDCXXSHARED, from the environment or from
#     Python's own build configuration (sysconfig). setuptools appends all of these to
#     the link command; torch.utils.cpp_extension passes them on as they are. Setups
#     for portable binaries and wheels add -static-libstdc++ on purpose, so that users
#     need no matching libstdc++; for a torch extension that is wrong. Dropped here.
#   * the linker finds libstdc++.a before any libstdc++.so: a toolchain installed
#     without the libstdc++.so development link, or an -L folder (LDFLAGS) holding only
#     the archive. ld takes the archive silently. `g++ -print-file-name=libstdc++.so`
#     shows the toolchain's own choice but not -L folders, so the library itself is
#     checked after linking and the build stops with the cause and the fix.
# nvcc compiles the .cu files but never links _C (the C++ linker does), so its
# host-link flags play no part.
STATIC_RUNTIME_FLAGS = ("-static-libstdc++", "-static-libgcc")
ENV_FLAG_SOURCES = ("LDFLAGS", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDSHARED", "LDCXXSHARED")


def _drop_static_runtime(compiler, ext) -> list[str]:
    """Remove the static runtime flags from every command the compiler runs, and from
    the extension's own link flags; return the flags dropped."""
    dropped = set()
    for name in compiler.executables:
        command = getattr(compiler, name, None)
        if isinstance(command, list):
            dropped.update(a for a in command if a in STATIC_RUNTIME_FLAGS)
            setattr(compiler, name, [a for a in command if a not in STATIC_RUNTIME_FLAGS])
    dropped.update(a for a in ext.extra_link_args if a in STATIC_RUNTIME_FLAGS)
    ext.extra_link_args = [a for a in ext.extra_link_args if a not in STATIC_RUNTIME_FLAGS]
    return sorted(dropped)


def _flag_sources(flags: list[str]) -> str:
    """Which environment variables set the flags, else Python's build configuration."""
    named = [v for v in ENV_FLAG_SOURCES if any(f in os.environ.get(v, "").split() for f in flags)]
    return ", ".join(named) if named else "Python's sysconfig (LDSHARED/CFLAGS)"


def _archive_taken(link_command: list[str]) -> str | None:
    """The libstdc++.a the linker takes with these flags, if it takes the archive.

    Links an empty library with the same command and reads ld's search (--verbose)."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = [*link_command, "-x", "c++", os.devnull, "-o", os.path.join(tmp, "probe.so")]
        try:
            out = subprocess.run(
                [*probe, "-Wl,--verbose"], capture_output=True, text=True, check=False
            ).stdout
        except OSError:
            return None
    found = re.search(r"attempt to open (\S*libstdc\+\+\.a) succeeded", out)
    return os.path.normpath(found.group(1)) if found else None


class BuildExt(BuildExtension):
    """torch's BuildExtension, keeping one build per torch and recording what it used."""

    def finalize_options(self) -> None:
        super().finalize_options()
        # Object files compiled against one torch's headers never serve another torch.
        tag = f"torch-{torch.__version__}-{'cuda' if WITH_CUDA else 'cpu'}".replace("+", "_")
        self.build_temp = os.path.join(self.build_temp, tag)

    def build_extension(self, ext) -> None:
        path = self._build_info_path(ext)
        # The sources may be older than a library built for another torch: relink then.
        if _read_json(path) != build_info():
            self.force = True
        self._link_shared_runtime(ext)
        super().build_extension(ext)
        self._check_shared_runtime(ext)
        with open(path, "w") as f:
            json.dump(build_info(), f, indent=1)
            f.write("\n")

    def _link_shared_runtime(self, ext) -> None:
        """Link libstdc++ and libgcc as shared libraries, as torch's own extensions do."""
        if not sys.platform.startswith("linux"):
            return
        dropped = _drop_static_runtime(self.compiler, ext)
        if dropped:
            print(
                f"torchcond: dropped {' '.join(dropped)} (from {_flag_sources(dropped)}): "
                "_C links the shared libstdc++ that torch loads",
                file=sys.stderr,
            )

    def _check_shared_runtime(self, ext) -> None:
        """Stop the build, with the cause and the fix, if _C still got its own libstdc++."""
        if not sys.platform.startswith("linux"):
            return
        library = self.get_ext_fullpath(ext.name)
        problem = _tool("check_libstdcxx").problem(library)
        if problem is None:
            return
        os.remove(library)  # else the next build would find it up to date
        dirs = [f"-L{d}" for d in [*ext.library_dirs, *(self.library_dirs or [])]]
        command = [*self.compiler.compiler_cxx, *self.compiler.linker_so_cxx[1:], *dirs]
        archive = _archive_taken([*command, *ext.extra_link_args])
        cause = (
            f"the linker took {archive} because no libstdc++.so comes before it on its "
            "search path; install the toolchain's libstdc++.so link (e.g. Debian/Ubuntu "
            "libstdc++-<gcc version>-dev, conda libstdcxx-ng) or put a folder holding "
            "libstdc++.so first with LDFLAGS=-L<folder>"
            if archive
            else f"something in the link command links it statically ({' '.join(command)}); "
            "remove it from LDFLAGS/CFLAGS/LDSHARED"
        )
        raise SystemExit(
            f"torchcond._C would carry its own copy of libstdc++ ({problem}), which cuts "
            f"error messages short or crashes the process: {cause}, then rebuild"
        )

    def copy_extensions_to_source(self) -> None:
        """In-place and editable builds: the record goes beside the library's copy."""
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace_file, _ = self._get_inplace_equivalent(build_py, ext)
            self.copy_file(
                self._build_info_path(ext),
                os.path.join(os.path.dirname(inplace_file), "_build_info.json"),
                level=self.verbose,
            )

    def _build_info_path(self, ext) -> str:
        """In the build folder (build_lib), beside the library as first linked."""
        library = os.path.join(
            self.build_lib, self.get_ext_filename(self.get_ext_fullname(ext.name))
        )
        return os.path.join(os.path.dirname(library), "_build_info.json")


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _torch_requirement() -> str:
    """The binary is tied to the torch release it compiled against (the C++ ABI and
    the private APIs it was checked on), so the wheel asks for that release."""
    return f"torch=={torch.__version__.split('+')[0]}"


# Project metadata is in pyproject.toml; what depends on the torch found at build
# time (the extension, the torch pin) is here.
setup(
    install_requires=[_torch_requirement()],
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
