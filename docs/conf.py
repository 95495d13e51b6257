"""Sphinx configuration for the torchcond documentation.

Build (from the repository root), as ``make docs`` does:

    python -m sphinx -n -W --keep-going -b html docs docs/_build/html
    python -m sphinx -n -W --keep-going -b doctest docs docs/_build/doctest

The first writes the HTML pages; the second runs every example in them (the
``testcode`` / ``doctest`` blocks of the ``.rst`` pages and the ``Examples`` of the
docstrings autodoc pulls in) and fails if an output differs from the page.

The export gallery (``gallery/index.rst`` and one page per example in
``exportdb_examples``) is generated here, before Sphinx reads any source, by
``gen_gallery.render``; those pages are build outputs and are not committed.
"""

import doctest
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
    "sphinx.ext.doctest",
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
exclude_patterns = [
    "_build",
    "composition_table.rst",
    "_inventories",
    "_screenshots",
    "Thumbs.db",
    ".DS_Store",
]
root_doc = "index"
default_role = "code"  # `x` is inline code, as ``x`` is

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# -- Cross-references (the build runs with -n: every reference must resolve) ----------

# CI cannot fetch the real objects.inv files, so the inventories are committed:
# docs/_inventories/make_inventories.py writes them (see its docstring to add a target).
# Links still point at the public sites.
intersphinx_mapping = {
    "python": ("https://docs.python.org/3/", os.path.join("_inventories", "python.inv")),
    "torch": ("https://docs.pytorch.org/docs/stable/", os.path.join("_inventories", "torch.inv")),
}
intersphinx_timeout = 1

nitpicky = True
nitpick_ignore = [
    # The return-type variable of cond/switch in their signatures: a private TypeVar of
    # torchcond._src.api ("whatever the branches return"), with no page of its own.
    ("py:class", "torchcond._src.api._Out"),
]

# -- Doctest (python -m sphinx -b doctest) ---------------------------------------------

# Every page's examples run in order in one namespace per page, after this (the pages
# say that their examples assume these two imports).
doctest_global_setup = """
import torch
import torchcond

torch.manual_seed(0)
"""
# ELLIPSIS lets a page elide the traceback lines above an error message (the messages
# themselves are compared in full); NORMALIZE_WHITESPACE ignores the blank lines that
# graph printouts begin and end with.
doctest_default_flags = (
    doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.DONT_ACCEPT_TRUE_FOR_1
)
doctest_show_successes = False

# -- HTML output -----------------------------------------------------------------------

html_theme = "furo"
html_title = f"torchcond {release}"
html_static_path = ["_static"]
html_css_files = ["torchcond.css"]
html_theme_options = {"navigation_with_keys": True}


# -- Build hooks -----------------------------------------------------------------------


def _keep_example_sources() -> None:
    """Name each doctest block after its page, and keep its source in linecache.

    Graph printouts (``print_readable``) show the source line of every traced
    operation, which torch looks up in ``linecache`` by file name. The doctest module
    compiles a block under ``<doctest NAME[i]>`` and serves its lines only while that
    block runs, so a branch defined in one block and traced in a later one would print
    no source (or another block's). Here the n-th block run from a page is named
    ``PAGE:n`` (``<doctest ir.rst:3[0]>`` for the third block of ir.rst), and its
    lines stay in the cache for the whole build. Numbering by position rather than by
    line number keeps printouts unchanged when text above them is edited.
    """
    import linecache

    from sphinx.ext.doctest import SphinxDocTestRunner

    run = SphinxDocTestRunner.run
    blocks_per_page: dict[str, int] = {}

    def run_keeping_sources(self, test, *args, **kwargs):
        if test.filename:
            page = os.path.basename(test.filename)
            blocks_per_page[page] = blocks_per_page.get(page, 0) + 1
            test.name = f"{page}:{blocks_per_page[page]}"
            for i, example in enumerate(test.examples):
                filename = f"<doctest {test.name}[{i}]>"
                lines = example.source.splitlines(keepends=True)
                linecache.cache[filename] = (len(example.source), None, lines, filename)
        return run(self, test, *args, **kwargs)

    SphinxDocTestRunner.run = run_keeping_sources


def setup(app):
    _keep_example_sources()
