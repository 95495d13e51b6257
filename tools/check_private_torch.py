"""Fail when torchcond uses a private torch name outside ``torchcond/_compat/``.

Private torch APIs move between releases; keeping every use in ``_compat`` (each
with the releases it was checked on) is what makes a new torch release a change to
one package. A name is private when a segment of its dotted path starts with one
underscore (``torch._C``, ``torch.utils._pytree``, ``torch._dynamo.config``); dunders
are public. The check follows imports, so ``import torch.utils._pytree as pytree``,
``from torch._subclasses import FakeTensor``, ``from torch.utils import _pytree`` and
``torch._C._len_torch_dispatch_stack`` are all caught, as is an attribute reached
through a public alias (``import torch.fx as fx; fx._symbolic_trace``).

It also fails on a private attribute read outside ``_compat`` (``module._buffers``,
``t._version``): an attribute with one leading underscore that torchcond does not
define itself, nor its extension module ``_C`` export.

C++ has no such layer. The private torch C++ that ``csrc/`` uses is listed in
``CPP_USES`` below, each with the files that may use it and what it is for, all
checked on torch 2.11, 2.13, 2.14 and 2.15. A private header or symbol in ``csrc/``
that the table does not list for that file fails, and so does a listed use that no
file makes any more.

Usage: ``python tools/check_private_torch.py [PACKAGE_DIR [CSRC_DIR]]`` (default:
torchcond, csrc). Prints one ``path:line:col: name`` per use and exits with 1 if there is any.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

ROOTS = ("torch", "functorch")

# Private torch C++ in csrc/: what it is for, and the files that use it (2.11-2.15).
_WRAPPERS = "functorch's and functionalization's tensor wrappers: the tensor under them"
_TLS = "this thread's dispatch key sets: the recorder's key, functorch's levels"
_PYBIND = "THPVariable and torch's pybind11 casters, as torch's own extensions use them"
CPP_USES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ATen/functorch/BatchedTensorImpl.h": (_WRAPPERS, ("batching", "eager", "write_recorder")),
    "at::functorch::maybeGetBatchedImpl": (_WRAPPERS, ("batching", "write_recorder")),
    "at::functorch::isBatchedTensor": (_WRAPPERS, ("batching", "eager")),
    "at::functorch::addBatchDim": ("vmap's batched tensor of a batch-first one", ("batching",)),
    "torch/csrc/autograd/forward_grad.h": ("whether a forward-AD level is open", ("batching",)),
    "torch::autograd::ForwardADLevel": ("whether a forward-AD level is open", ("batching",)),
    "ATen/FunctionalTensorWrapper.h": (_WRAPPERS, ("write_recorder",)),
    "at::functionalization::impl::isFunctionalTensor": (_WRAPPERS, ("write_recorder",)),
    "at::functionalization::impl::unsafeGetFunctionalWrapper": (_WRAPPERS, ("write_recorder",)),
    "c10/core/impl/LocalDispatchKeySet.h": (_TLS, ("batching", "write_recorder")),
    "c10::impl::ExcludeDispatchKeyGuard": (_TLS, ("batching", "write_recorder")),
    "c10::impl::tls_is_dispatch_key_included": (_TLS, ("batching", "write_recorder")),
    "c10::impl::tls_is_dispatch_key_excluded": (_TLS, ("write_recorder",)),
    "c10::impl::tls_set_dispatch_key_included": (_TLS, ("write_recorder",)),
    "c10::impl::tls_set_dispatch_key_excluded": (_TLS, ("write_recorder",)),
    "DispatchKey::DeferredInit": (
        "the key the write recorder borrows (write_recorder.cpp says why)",
        ("write_recorder",),
    ),
    "c10/core/impl/TorchDispatchModeTLS.h": ("whether a dispatch mode is active", ("eager",)),
    "c10::impl::TorchDispatchModeTLS::stack_len": ("whether a dispatch mode is active", ("eager",)),
    "ATen/PythonTorchFunctionTLS.h": ("whether a torch function mode is active", ("eager",)),
    "at::impl::PythonTorchFunctionTLS::stack_len": (
        "whether a torch function mode is active",
        ("eager",),
    ),
    "torch/csrc/jit/frontend/tracer.h": ("whether torch.jit traces", ("eager",)),
    "torch::jit::tracer::isTracing": ("whether torch.jit traces", ("eager",)),
    "ATen/core/LegacyTypeDispatch.h": ("AutoDispatchBelowADInplaceOrView", ("ops",)),
    "torch/csrc/autograd/python_variable.h": (_PYBIND, ("batching", "eager", "write_recorder")),
    "torch/csrc/utils/pybind.h": (
        _PYBIND,
        ("batching", "eager", "ops", "watch", "write_recorder"),
    ),
    "torch/csrc/Exceptions.h": (
        "torch's C++-to-Python error translation",
        ("batching", "write_recorder"),
    ),
    "THPVariableClass": ("whether an object is exactly torch.Tensor", ("eager",)),
    "->backward_hooks": ("an operand's hooks, held and put back", ("write_recorder",)),
    "->post_accumulate_grad_hooks": ("an operand's hooks, held and put back", ("write_recorder",)),
}
_CPP_PRIVATE = re.compile(
    r"#include <(ATen/functorch/[^>]+|c10/core/impl/[^>]+|torch/csrc/[^>]+"
    r"|ATen/FunctionalTensorWrapper\.h|ATen/PythonTorchFunctionTLS\.h"
    r"|ATen/core/LegacyTypeDispatch\.h)>"
    r"|(at::functorch::\w+|c10::impl::\w+(?:::\w+)?|at::impl::\w+(?:::\w+)?"
    r"|at::functionalization::impl::\w+|torch::jit::tracer::\w+|torch::autograd::ForwardADLevel"
    r"|DispatchKey::DeferredInit"
    r"|->backward_hooks|->post_accumulate_grad_hooks|THPVariableClass)"
)
_CPP_SUFFIXES = (".cpp", ".h", ".cu", ".cuh")


def cpp_uses(source: str) -> list[tuple[int, int, str]]:
    """(line, col, name) for every private torch header or symbol in C++ ``source``."""
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        for match in _CPP_PRIVATE.finditer(line):
            found.append((number, match.start(), match.group(1) or match.group(2)))
    return found


def check_cpp(csrc: pathlib.Path) -> int:
    """Print each private C++ use that ``CPP_USES`` does not list for its file, and each
    listed use that no file makes. Return how many."""
    bad = 0
    used: set[tuple[str, str]] = set()
    for path in sorted(p for p in csrc.rglob("*") if p.suffix in _CPP_SUFFIXES):
        for line, col, name in cpp_uses(path.read_text()):
            used.add((name, path.stem))
            if path.stem not in CPP_USES.get(name, ("", ()))[1]:
                print(f"{path}:{line}:{col + 1}: private torch C++ {name} (list it in CPP_USES)")
                bad += 1
    for name, (_, files) in CPP_USES.items():
        for stem in files:
            if (name, stem) not in used:
                print(f"{__file__}: CPP_USES lists {name} for {stem}, which no longer uses it")
                bad += 1
    return bad


# Private attribute names that are not torch's: those of named tuples.
_NOT_TORCH = frozenset(("_replace", "_asdict", "_fields", "_make"))


def defined_names(package: pathlib.Path) -> set[str]:
    """Every name that torchcond's Python defines: functions, classes, variables,
    attributes it sets, arguments, imports and ``__slots__`` entries."""
    names: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)  # __slots__ entries, NamedTuple fields
    return names


def private_attributes(source: str, defined: set[str]) -> list[tuple[int, int, str]]:
    """(line, col, .name) for each private attribute read in ``source`` that torchcond
    does not define, except on its extension module ``_C``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__") or name in defined:
            continue
        if name in _NOT_TORCH or (isinstance(node.value, ast.Name) and node.value.id == "_C"):
            continue
        found.append((node.lineno, node.col_offset, "." + name))
    return found


def _private(dotted: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))


def _is_torch(dotted: str) -> bool:
    return dotted.split(".")[0] in ROOTS


def _dotted(node: ast.expr) -> tuple[str, ast.Name] | None:
    """``a.b.c`` as "a.b.c" with its root Name, or None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts)), node


def uses(source: str) -> list[tuple[int, int, str]]:
    """(line, col, private dotted name) for every private torch name in ``source``."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> the torch module or object it is
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_torch(a.name):
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        aliases[a.name.split(".")[0]] = a.name.split(".")[0]
                    if _private(a.name):
                        found.append((node.lineno, node.col_offset, a.name))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if _is_torch(node.module):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    aliases[a.asname or a.name] = full
                    if _private(full):
                        found.append((node.lineno, node.col_offset, full))
    for node in ast.walk(tree):
        # The outermost attribute chain only: torch._C._x is one use, not two.
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is None:
                continue
            path, root = dotted
            base = aliases.get(root.id)
            if base is None:
                continue
            full = base + path[len(root.id) :]
            if _private(full) and not _private(base):
                found.append((node.lineno, node.col_offset, full))
    # Keep the longest chain per position (ast.walk also visits the inner Attributes).
    longest: dict[tuple[int, int], str] = {}
    for line, col, name in found:
        if len(name) > len(longest.get((line, col), "")):
            longest[(line, col)] = name
    return sorted((line, col, name) for (line, col), name in longest.items())


def main(argv: list[str]) -> int:
    package = pathlib.Path(argv[1] if len(argv) > 1 else "torchcond")
    csrc = pathlib.Path(argv[2] if len(argv) > 2 else "csrc")
    shim = package / "_compat"
    defined = defined_names(package)
    bad = 0
    for path in sorted(package.rglob("*.py")):
        if shim in path.parents:
            continue
        source = path.read_text()
        for line, col, name in uses(source):
            print(f"{path}:{line}:{col + 1}: private torch API {name} (move it to {shim}/)")
            bad += 1
        for line, col, name in private_attributes(source, defined):
            print(f"{path}:{line}:{col + 1}: private attribute {name} (read it in {shim}/)")
            bad += 1
    bad += check_cpp(csrc)
    if bad:
        print(f"check_private_torch: {bad} private torch use(s) outside {shim}/ and CPP_USES")
        return 1
    print(f"check_private_torch: no private torch use outside {shim}/ and CPP_USES")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
