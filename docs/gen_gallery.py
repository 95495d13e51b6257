"""Write the export gallery: one reStructuredText page per example in ``exportdb_examples``.

Each page shows the example's title (its module's ``TITLE``, or a title made from its
name), its docstring, its source, and the graph that
``torch.export.export(..., strict=False)`` produces for it. The index lists every
example with its title and the docstring's text as one paragraph. Run as a script
(``python docs/gen_gallery.py [OUT_DIR]``, default ``docs/gallery``) or import it and
call ``render(out_dir)``, as ``docs/conf.py`` does at build time. Output is
deterministic: file paths in the graph printouts are made relative to the repo root.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import textwrap

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import torch  # noqa: E402

import torchcond  # noqa: E402,F401  (registers the operators)

INDEX_INTRO = """\
Export gallery
==============

Each page below is one pattern of :func:`torchcond.cond` / :func:`torchcond.switch`
use, exported with :func:`torch.export.export` (``strict=False``) under dynamic
shapes. A page shows the example's source and the exported program's
``graph_module``, both taken from ``exportdb_examples/`` when the docs are built: the
conditional is a single ``torchcond_cond`` or ``torchcond_switch`` node whose branches
are the nested ``true_graph_*`` / ``false_graph_*`` / ``branch_graph_*`` submodules.
The test suite exports every example and runs it on inputs that reach every branch.
"""


def _examples():
    from exportdb_examples import EXAMPLES

    return EXAMPLES


def export_example(example) -> torch.export.ExportedProgram:
    """Export one example module's ``Model`` the way the tests do (seeded, non-strict)."""
    torch.manual_seed(0)
    model = example.Model().eval()
    return torch.export.export(
        model, example.example_args, dynamic_shapes=example.dynamic_shapes, strict=False
    )


def _relative_paths(text: str) -> str:
    """``# File: /abs/repo/exportdb_examples/x.py:12`` -> ``# File: exportdb_examples/x.py:12``.

    Paths into torch itself become ``torch/...``, so no machine-specific prefix survives.
    """
    torch_parent = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    roots = {REPO_ROOT, os.path.realpath(REPO_ROOT), torch_parent, os.path.realpath(torch_parent)}
    for root in sorted(roots, key=len, reverse=True):
        text = text.replace(root.rstrip(os.sep) + os.sep, "")
    return re.sub(r"(# File: )\S*?site-packages/", r"\1", text)


def _strip_trailing_space(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def graph_text(ep: torch.export.ExportedProgram) -> str:
    text = ep.graph_module.print_readable(print_output=False)
    text = _relative_paths(text)
    # Defensive: no memory addresses in the page even if some repr sneaks one in.
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)
    return _strip_trailing_space(text)


def title(name: str, example) -> str:
    """The example's ``TITLE``, or its name in words (``nested_cond`` -> ``Nested cond``)."""
    text = getattr(example, "TITLE", None) or name.replace("_", " ").capitalize()
    return " ".join(text.split())


def _heading(text: str, underline: str = "=") -> str:
    return f"{text}\n{underline * len(text)}"


def _docstring(example) -> str:
    return inspect.cleandoc(example.__doc__ or "").strip()


def description(example) -> str:
    """The docstring as one paragraph (its summary line and the text after it)."""
    return " ".join(_docstring(example).split())


def _indent(text: str) -> str:
    return textwrap.indent(text, "   ", lambda line: bool(line.strip()))


def render_page(name: str, example, out_dir: str) -> str:
    """The reST text of one example's page, as it will be written into ``out_dir``."""
    source = os.path.abspath(example.__file__)
    include = os.path.relpath(source, os.path.abspath(out_dir)).replace(os.sep, "/")
    ep = export_example(example)
    parts = [
        f".. _gallery-{name}:",
        "",
        _heading(title(name, example)),
        "",
        _docstring(example),
        "",
        f"Source: ``exportdb_examples/{name}.py``",
        "",
        f".. literalinclude:: {include}",
        "   :language: python",
        "   :start-at: import torch",  # the docstring is the text above
        "",
        "Exported program",
        "----------------",
        "",
        "The graph of ``torch.export.export(Model(), example_args,",
        "dynamic_shapes=dynamic_shapes, strict=False)``, as",
        "``ep.graph_module.print_readable()`` prints it when the docs are built:",
        "",
        ".. code-block:: python",
        "",
        _indent(graph_text(ep)),
        "",
    ]
    return "\n".join(parts)


def render_index(examples) -> str:
    """The index: each example's title (a link to its page) and its description."""
    lines = [INDEX_INTRO]
    for name, example in examples.items():
        lines += [f":doc:`{title(name, example)} <{name}>`", f"   {description(example)}", ""]
    lines += [".. toctree::", "   :hidden:", ""]
    lines += [f"   {name}" for name in examples]
    return "\n".join(lines) + "\n"


def _write_if_changed(path: str, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds exactly that (keeps mtimes stable)."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    except FileNotFoundError:
        pass
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return True


def render(out_dir: str) -> list[str]:
    """Write ``<name>.rst`` per example and ``index.rst`` into ``out_dir``; return the paths.

    Idempotent: rerunning writes identical files (and leaves unchanged ones untouched).
    Pages of examples that no longer exist are removed.
    """
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    examples = _examples()
    written = []
    for name, example in examples.items():
        path = os.path.join(out_dir, f"{name}.rst")
        _write_if_changed(path, render_page(name, example, out_dir))
        written.append(path)
    index = os.path.join(out_dir, "index.rst")
    _write_if_changed(index, render_index(examples))
    written.append(index)
    keep = {os.path.basename(p) for p in written}
    for stale in sorted(os.listdir(out_dir)):
        if stale.endswith(".rst") and stale not in keep:
            os.remove(os.path.join(out_dir, stale))
    return written


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = argv[0] if argv else os.path.join(REPO_ROOT, "docs", "gallery")
    for path in render(out_dir):
        print(os.path.relpath(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
