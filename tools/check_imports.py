"""Fail when torchcond's own imports form a cycle, or when ``_compat`` imports upward.

Imports go one way: ``api`` -> the operators and their rules -> ``tracing`` ->
``_compat``. A cycle means two modules each need the other, so neither owns the
concept; ``_compat`` (the shim over private torch APIs) may import only itself and
``errors``, which imports nothing. Every import counts, module-level or inside a
function, relative or absolute.

Usage: ``python tools/check_imports.py [PACKAGE_DIR]`` (default: torchcond).
Prints the cycle or the upward import and exits with 1 if there is one.
"""

from __future__ import annotations

import ast
import pathlib
import sys

LEAVES = ("errors", "_version")  # import nothing of the package; anyone may import them


def module_name(package: pathlib.Path, path: pathlib.Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(package: pathlib.Path, path: pathlib.Path, names: set[str]) -> set[str]:
    """The package's modules that ``path`` imports."""
    this = module_name(package, path)
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = this.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod when there is one, and
            # otherwise a name that pkg's __init__ defines.
            targets = [
                f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in names else prefix
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in names and t != this)
    return found


def graph(package: pathlib.Path) -> dict[str, set[str]]:
    paths = sorted(package.rglob("*.py"))
    # Extension modules (torchcond._C) are known by their type stubs.
    names = {module_name(package, p) for p in [*paths, *package.rglob("*.pyi")]}
    return {module_name(package, p): imports(package, p, names) for p in paths}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def upward_from_compat(package: str, edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    compat = f"{package}._compat"
    allowed = {f"{package}.{leaf}" for leaf in LEAVES}
    return [
        (src, dst)
        for src, dsts in sorted(edges.items())
        if src == compat or src.startswith(compat + ".")
        for dst in sorted(dsts)
        if not (dst == compat or dst.startswith(compat + ".") or dst in allowed)
    ]


def main(argv: list[str]) -> int:
    package = pathlib.Path(argv[1] if len(argv) > 1 else "torchcond").resolve()
    edges = graph(package)
    # The package's own __init__ re-exports the public API from everywhere; it is the
    # top of the graph and nothing inside imports it.
    top = package.name
    inner = {src: {d for d in dsts if d != top} for src, dsts in edges.items() if src != top}
    failed = False
    cycle = find_cycle(inner)
    if cycle:
        print("check_imports: an import cycle: " + " -> ".join(cycle))
        failed = True
    for src, dst in upward_from_compat(top, inner):
        print(f"check_imports: {src} imports {dst}; _compat may import only itself and {LEAVES}")
        failed = True
    for src, dsts in sorted(edges.items()):
        if src != top and top in dsts:
            print(f"check_imports: {src} imports the package's __init__ ({top})")
            failed = True
    if not failed:
        print(
            f"check_imports: {len(inner)} modules, imports one-way, _compat imports nothing above it"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
