"""Sphinx configuration of bursarcore's API reference (docs/api/).

Build it with warnings as errors, from the repository's root::

    pip install ".[docs]"
    python -m sphinx -W --keep-going -b html docs/api build/api

``tests/docs/test_docs_api.py`` runs the same build. The reference documents the tree it sits
in: ``src/`` goes first on the path, ahead of any installed copy. It documents the
plain-Python backend (``BURSARCORE_NO_EXTENSIONS=1``): every backend has its interface, and
the build then needs no compiled extension in the tree.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
os.environ["BURSARCORE_NO_EXTENSIONS"] = "1"

import bursarcore  # noqa: E402

project = "bursarcore"
author = "the bursarcore authors"
copyright = "the bursarcore authors"
release = version = bursarcore.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False
# an "Attributes" section as a field list: autodoc already lists each dataclass field as
# a member (bool options are on whatever their value), and an attribute directive per
# entry would describe the same object twice
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
default_role = "code"          # `x` in a docstring is code, as it is in the Markdown docs
exclude_patterns = ["_build"]
html_theme = "alabaster"
