"""The library's seams: what importing each module of utils pulls in.

A fresh process per module (forked from one that has loaded torch and pyplot alone) imports it and
lists which `utils.*` modules, IPython and ipywidgets got loaded (`import utils.x` runs
utils/__init__.py first, so its modules are always there). The core modules (measuring, results,
models, kernel categories) load no chapter module and not the panels; a chapter module loads another
chapter's module only where CHAPTER_IMPORTS says so; and only the panels (utils.widgets) load IPython
or ipywidgets when imported.
"""
import json
import subprocess
import sys

import pytest

from conftest import REPO

MODULES = sorted(p.stem for p in (REPO / "utils").glob("*.py") if p.stem != "__init__")
CORE = ("compare", "timing", "runs", "env", "results", "models", "compiler", "kernels")
CHAPTERS = ("llm", "training", "gnn", "diffusion", "scale_out", "scale_out_worker")
DISPLAY = ("IPython", "ipywidgets")
# Chapter 8's worker trains chapter 2's GPT with chapter 2's loss and batches; its notebook side re-exports the worker.
CHAPTER_IMPORTS = {"scale_out": {"scale_out_worker", "training"}, "scale_out_worker": {"training"}}

# One interpreter loads torch, Dynamo and pyplot (the library needs them all, and they are no seam), then
# forks a fresh child per module, which imports it and prints what got loaded: {"name": ..., "loaded": [...]} or {"name": ..., "error": ...}.
FORK_PER_MODULE = """
import json, os, sys, traceback
import matplotlib.pyplot, torch, torch._dynamo
WATCHED = lambda: sorted(m for m in sys.modules if m.startswith("utils") or m in {display!r})
assert not WATCHED(), WATCHED()
for name in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            __import__("utils." + name)
            result = {{"name": name, "loaded": [m for m in WATCHED() if m != "utils"]}}
        except BaseException:
            result = {{"name": name, "error": traceback.format_exc()[-2000:]}}
        with os.fdopen(write, "w") as f:
            f.write(json.dumps(result))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        print(f.read(), flush=True)
    os.waitpid(pid, 0)
"""


@pytest.fixture(scope="module")
def loaded():
    """{module: the utils.* modules, IPython and ipywidgets that `import utils.<module>` loaded}, one process each."""
    proc = subprocess.run([sys.executable, "-c", FORK_PER_MODULE.format(display=DISPLAY), *MODULES], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    errors = {r["name"]: r["error"] for r in results if "error" in r}
    assert not errors, "\n".join(f"import utils.{name} failed:\n{error}" for name, error in errors.items())
    return {r["name"]: r["loaded"] for r in results}


def chapters_in(modules):
    return {m.removeprefix("utils.") for m in modules} & set(CHAPTERS)


def test_every_module_is_listed(loaded):
    assert set(CORE) | set(CHAPTERS) <= set(MODULES), "a module named here is gone"
    assert sorted(loaded) == MODULES
    assert all(f"utils.{name}" in modules for name, modules in loaded.items())


@pytest.mark.parametrize("name", CORE)
def test_core_modules_load_no_chapter_and_no_panels(loaded, name):
    modules = loaded[name]
    assert not chapters_in(modules), f"utils.{name} loads chapter modules {sorted(chapters_in(modules))}"
    assert "utils.widgets" not in modules, f"utils.{name} loads the panels"


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_modules_load_only_the_chapters_they_name(loaded, name):
    others = chapters_in(loaded[name]) - {name}
    assert others <= CHAPTER_IMPORTS.get(name, set()), \
        f"utils.{name} loads {sorted(others - CHAPTER_IMPORTS.get(name, set()))}: import it where it is used"


@pytest.mark.parametrize("name", [m for m in MODULES if m != "widgets"])
def test_only_the_panels_load_a_display_library_on_import(loaded, name):
    """Panels, tables and glue load IPython and ipywidgets when used: a torchrun worker or a script never does."""
    assert not set(DISPLAY) & set(loaded[name]), f"utils.{name} loads {sorted(set(DISPLAY) & set(loaded[name]))}"
