"""Sphinx configuration for the torchcond documentation.

Build (from the repository root):

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The export gallery (``gallery/index.rst`` and one page per example in
``exportdb_examples``) is generated here, before Sphinx reads any source, by
``gen_gallery.render``; those pages are build outputs and are not committed.
"""

import os
import sys

DOCS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(DOCS_DIR)
for path in (DOCS_DIR, REPO_ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

import gen_gallery  # noqa: E402

import torchcond  # noqa: E402  (autodoc imports it too; fail early if it is missing)

gen_gallery.render(os.path.join(DOCS_DIR, "gallery"))

# -- Project information ---------------------------------------------------------------

project = "torchcond"
author = "the torchcond authors"
copyright = "the torchcond authors"
release = torchcond.__version__
version = ".".join(release.split(".")[:2])

# -- General configuration -------------------------------------------------------------

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
root_doc = "index"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# -- HTML output -----------------------------------------------------------------------

html_theme = "alabaster"
html_title = f"torchcond {release}"
html_theme_options = {
    "description": "Structured conditionals for PyTorch",
    "fixed_sidebar": True,
}
