"""Generate the benchmarks page (book/benchmarks.md) from results/<gpu>/*.json as the build starts.

A Sphinx extension for this book's build (_config.yml, `sphinx: local_extensions:`), so that
`make book` and the tests' site build (`jupyter-book build . --all -W -n --keep-going`) both write
the page from the results files present, before Sphinx looks for its sources. The page itself is
git-ignored. A results file that is empty, not JSON or not a results file, or a chapter of the
table of contents without one, stops the build with an error naming the file. The work is done by
utils/benchmarks.py, loaded here without utils/__init__.py (which imports torch).
"""
import importlib
import sys
import types
from pathlib import Path

from sphinx.errors import ExtensionError

PACKAGE = "_book_utils"  # utils/ under another name: its modules, without the package's __init__
UTILS = Path(__file__).resolve().parents[2] / "utils"


def load_utils_module(name):
    """One module of this repository's utils/, imported without utils/__init__.py (which imports torch)."""
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(UTILS)]
        sys.modules[PACKAGE] = package
    return importlib.import_module(f"{PACKAGE}.{name}")


def load_benchmarks():
    """This repository's utils/benchmarks.py, imported without importing torch."""
    return load_utils_module("benchmarks")


def generate(app, config=None):
    """Write the page; a results problem becomes an ExtensionError that names the file."""
    repo = Path(app.srcdir)
    benchmarks = load_benchmarks()
    try:
        path = benchmarks.write_page(repo)
    except benchmarks.ResultsError as error:
        raise ExtensionError(f"benchmarks page: {error}") from error
    return path


def setup(app):
    app.connect("config-inited", generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
