"""Fail when torchcond uses a private torch name outside ``torchcond/_compat/``.

Private torch APIs move between releases; keeping every use in ``_compat`` (each
with the releases it was checked on) is what makes a new torch release a change to
one package. A name is private when a segment of its dotted path starts with one
underscore (``torch._C``, ``torch.utils._pytree``, ``torch._dynamo.config``); dunders
are public. The check follows imports, so ``import torch.utils._pytree as pytree``,
``from torch._subclasses import FakeTensor``, ``from torch.utils import _pytree`` and
``torch._C._len_torch_dispatch_stack`` are all caught, as is an attribute reached
through a public alias (``import torch.fx as fx; fx._symbolic_trace``).

Usage: ``python tools/check_private_torch.py [PACKAGE_DIR]`` (default: torchcond).
Prints one ``path:line:col: name`` per use and exits with 1 if there is any.
"""

from __future__ import annotations

import ast
import pathlib
import sys

ROOTS = ("torch", "functorch")


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
    shim = package / "_compat"
    bad = 0
    for path in sorted(package.rglob("*.py")):
        if shim in path.parents:
            continue
        for line, col, name in uses(path.read_text()):
            print(f"{path}:{line}:{col + 1}: private torch API {name} (move it to {shim}/)")
            bad += 1
    if bad:
        print(f"check_private_torch: {bad} private torch name(s) outside {shim}/")
        return 1
    print(f"check_private_torch: no private torch names outside {shim}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
