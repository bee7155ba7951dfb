"""Sphinx configuration of calibkit's API reference (built by `make docs`)."""

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "..")))

import calibkit  # noqa: E402

project = "calibkit"
author = "calibkit contributors"
release = version = calibkit.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon"]
autosummary_generate = True
autosummary_imported_members = False
# Each object is documented once, in the module that defines it (re-exports listed in a package's
# __all__ are not repeated).
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True,
                           "ignore-module-all": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" sections as fields, not as duplicate attribute entries
templates_path = ["_templates"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = f"calibkit {release} API reference"
nitpicky = False
