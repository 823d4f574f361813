"""Sphinx configuration. Build with `python -m sphinx -W -b html docs docs/_build/html`.

Pages whose subject is not there yet are left out of the build (and out of every toctree):
an optional API page not enabled below or whose module does not import, and the generated ONNX
coverage table before it has been generated. So the build passes with -W at every stage."""
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import express  # noqa: E402

project = "Express"
author = "Express contributors"
copyright = "the Express contributors"
release = version = express.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
default_role = "code"                 # `x` in docstrings is code, as in the source
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"undoc-members": False}
html_theme = "alabaster"
html_theme_options = {"description": "a lazy, NumPy-like inference engine", "fixed_sidebar": True}
html_title = f"Express {release}"
exclude_patterns = ["_build"]

# Optional API pages: page -> (module, a name it must define). A page is built when it is enabled
# here (once its part has landed and its docstrings build cleanly) and its module imports;
# EXPRESS_DOCS_OPTIONAL=all builds every page whose module imports, to try one out.
OPTIONAL_API = {
    "api/onnx": ("express.onnx", "load"),
    "api/llm": ("llm", "load"),
    "api/diffusion": ("diffusion", "StableDiffusionPipeline"),
}
ENABLED_API: set[str] = {"api/onnx", "api/llm", "api/diffusion"}
if os.environ.get("EXPRESS_DOCS_OPTIONAL") == "all":
    ENABLED_API = set(OPTIONAL_API)


def _available(module: str, name: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), name)
    except Exception:  # an optional part that does not import yet is simply not documented yet
        return False


missing_pages = {page for page, (mod, name) in OPTIONAL_API.items()
                 if page not in ENABLED_API or not _available(mod, name)}
if not os.path.exists(os.path.join(HERE, "onnx_coverage.rst")):
    missing_pages.add("onnx_coverage")
exclude_patterns += [p + ".rst" for p in sorted(missing_pages)]


def _drop_missing_from_toctrees(app, docname, source):
    """Remove toctree entries naming a left-out page (entries are relative to the document)."""
    base = os.path.dirname(docname)
    lines = source[0].split("\n")
    keep = [ln for ln in lines
            if not (ln.startswith("   ") and ln.strip()
                    and os.path.normpath(os.path.join(base, ln.strip())) in missing_pages)]
    source[0] = "\n".join(keep)


def setup(app):
    app.connect("source-read", _drop_missing_from_toctrees)
