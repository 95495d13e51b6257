"""Write the local intersphinx inventories ``python.inv`` and ``torch.inv``.

CI machines reach PyPI but not docs.python.org or docs.pytorch.org, so the docs build
cannot fetch the real ``objects.inv`` files. ``docs/conf.py`` points
``intersphinx_mapping`` at the two files written here instead, with the public sites as
base URLs, so links in the built pages go to the real documentation.

The inventories list only the targets these docs reference (in the ``.rst`` pages
and, through autodoc, in torchcond's signatures and docstrings), each with its page
and anchor on the public site. To regenerate after adding a reference, add the target
to ``PYTHON`` or ``TORCH`` below and run, from the repository root::

    python docs/_inventories/make_inventories.py

then commit the two ``.inv`` files. A reference to a target missing here fails the
nitpicky docs build (``make docs``) with "reference target not found". Entries are
``(name, role, uri)``; a ``uri`` ending in ``$`` stands for ``name`` (the usual
Sphinx shorthand for an anchor equal to the object's name).
"""

from __future__ import annotations

import os
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))

#: https://docs.python.org/3/ (Python 3.11 and later agree on these pages).
PYTHON_PROJECT = ("Python", "3")
PYTHON = [
    ("collections.abc.Callable", "py:class", "library/collections.abc.html#$"),
    ("collections.abc.Sequence", "py:class", "library/collections.abc.html#$"),
    ("typing.Literal", "py:data", "library/typing.html#$"),
    ("typing.TypeVar", "py:class", "library/typing.html#$"),
    ("bool", "py:class", "library/functions.html#$"),
    ("int", "py:class", "library/functions.html#$"),
    ("float", "py:class", "library/functions.html#$"),
    ("tuple", "py:class", "library/stdtypes.html#$"),
    ("list", "py:class", "library/stdtypes.html#$"),
    ("dict", "py:class", "library/stdtypes.html#$"),
    ("Exception", "py:exception", "library/exceptions.html#$"),
    ("TypeError", "py:exception", "library/exceptions.html#$"),
    ("ValueError", "py:exception", "library/exceptions.html#$"),
    ("RuntimeError", "py:exception", "library/exceptions.html#$"),
    ("NotImplementedError", "py:exception", "library/exceptions.html#$"),
    ("IndexError", "py:exception", "library/exceptions.html#$"),
    ("UserWarning", "py:exception", "library/exceptions.html#$"),
]

#: https://docs.pytorch.org/docs/stable/ (one page per function under generated/;
#: classes and functions of a topic page are anchored on that page).
TORCH_PROJECT = ("PyTorch", "stable")
TORCH = [
    ("torch.Tensor", "py:class", "tensors.html#$"),
    ("torch.SymBool", "py:class", "torch.html#$"),
    ("torch.SymInt", "py:class", "torch.html#$"),
    ("torch.cond", "py:function", "generated/torch.cond.html#$"),
    ("torch.where", "py:function", "generated/torch.where.html#$"),
    ("torch.vmap", "py:function", "generated/torch.vmap.html#$"),
    ("torch.compile", "py:function", "generated/torch.compile.html#$"),
    ("torch.func.grad", "py:function", "generated/torch.func.grad.html#$"),
    ("torch.func.jvp", "py:function", "generated/torch.func.jvp.html#$"),
    ("torch.func.hessian", "py:function", "generated/torch.func.hessian.html#$"),
    ("torch.autograd.grad", "py:function", "generated/torch.autograd.grad.html#$"),
    ("torch.nn.Module", "py:class", "generated/torch.nn.Module.html#$"),
    ("torch.nn.Linear", "py:class", "generated/torch.nn.Linear.html#$"),
    ("torch.fx.GraphModule", "py:class", "fx.html#$"),
    ("torch.fx.GraphModule.print_readable", "py:method", "fx.html#$"),
    ("torch.export.export", "py:function", "export.html#$"),
    ("torch.export.save", "py:function", "export.html#$"),
    ("torch.export.load", "py:function", "export.html#$"),
    ("torch.export.Dim", "py:function", "export.html#$"),
    ("torch.export.ExportedProgram", "py:class", "export.html#$"),
    ("torch.export.ExportedProgram.module", "py:method", "export.html#$"),
    ("torch.export.ExportedProgram.run_decompositions", "py:method", "export.html#$"),
    # autodoc names a class in a signature by its defining module (``__module__``);
    # PyTorch documents ExportedProgram under its public path, on the same anchor.
    (
        "torch.export.exported_program.ExportedProgram",
        "py:class",
        "export.html#torch.export.ExportedProgram",
    ),
]


def _line(name: str, role: str, uri: str) -> str:
    # "-" as the display name means "same as name"; priority 1 is Sphinx's default.
    return f"{name} {role} 1 {uri} -"


def write_inventory(path: str, project: tuple[str, str], entries) -> None:
    """Write a version-2 Sphinx inventory (the ``objects.inv`` format) to ``path``."""
    name, version = project
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {name}\n"
        f"# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    body = "".join(_line(*entry) + "\n" for entry in sorted(entries))
    with open(path, "wb") as f:
        f.write(header.encode())
        f.write(zlib.compress(body.encode(), 9))


def main() -> int:
    for filename, project, entries in (
        ("python.inv", PYTHON_PROJECT, PYTHON),
        ("torch.inv", TORCH_PROJECT, TORCH),
    ):
        path = os.path.join(HERE, filename)
        write_inventory(path, project, entries)
        print(f"{os.path.relpath(path)}: {len(entries)} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
