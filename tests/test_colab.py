"""Each chapter's first cells on a simulated Colab: the clone, the installs, `import utils`, the provenance.

Colab is stood in for by what the set-up cell can see of it:
- `google.colab` is imported when the kernel starts (an IPython start-up file in a temporary
  IPYTHONDIR imports a stand-in package from a temporary folder on PYTHONPATH), so the cell takes
  its `"google.colab" in sys.modules` branch;
- the network is a local clone: a temporary GIT_CONFIG_GLOBAL rewrites the repository URL of
  _config.yml to this checkout (`url.<file URL>.insteadOf`), so the cell's `!git clone` runs as
  written and fetches the committed HEAD, as Colab would fetch `main`;
- pip records what it was asked to install and installs nothing (a stand-in `pip` module first on
  PYTHONPATH serves `%pip` and `python -m pip`, and a `pip` script first on PATH serves `!pip`);
- the kernel starts in a temporary folder standing for /content, and the executed copy of the
  notebook has `/content/` replaced by that folder: the only change made to the cells.
Only the cells up to and including the `parameters` cell run, then one cell that reports where
`utils` came from.
"""
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9]*.ipynb"))
COLAB_ROOT = "/content/"
# Colab comes with these; reinstalling one could replace the CUDA build matched to its GPU driver.
NEVER_INSTALL = {"torch", "torchvision", "torchaudio", "triton", "pytorch-triton"}
REPORT = "COLAB-TEST-REPORT "


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def requirements():
    """requirements.txt as {canonical name: Requirement}."""
    reqs = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            reqs[canonicalize_name(req.name)] = req
    return reqs


# pip options that install from elsewhere than the names given, or replace what Colab has
RISKY_OPTIONS = {"-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-U", "--upgrade",
                 "--force-reinstall", "--ignore-installed", "-I"}


def installs(pip_args):
    """The requirements of one recorded `pip install` command line; fails on a risky option."""
    command = f"pip {' '.join(pip_args)}"
    assert pip_args and pip_args[0] == "install", f"the set-up cell ran `{command}`"
    risky = RISKY_OPTIONS & {a.split("=", 1)[0] for a in pip_args[1:]}
    assert not risky, f"`{command}`: {sorted(risky)} could replace Colab's torch or its dependencies; " \
        "name the packages to install"
    reqs = [Requirement(a) for a in pip_args[1:] if not a.startswith("-")]
    assert reqs, f"`{command}` names no package"
    return reqs


@pytest.fixture(scope="module")
def checkout():
    """This checkout, to clone from; a tree copied without its .git cannot stand in for GitHub."""
    if not (REPO / ".git").exists():
        pytest.skip("the checkout has no .git to clone from")
    return REPO


@pytest.fixture()
def colab(tmp_path, monkeypatch, repository_url):
    """A Colab stand-in for one kernel: see the module's docstring. Returns its folders."""
    site = tmp_path / "site"
    (site / "google" / "colab").mkdir(parents=True)
    # a pkgutil-style namespace, so google.protobuf and friends still import from site-packages
    (site / "google" / "__init__.py").write_text("__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n")
    (site / "google" / "colab" / "__init__.py").write_text('"""Stands in for Colab\'s google.colab (tests/test_colab.py)."""\n')
    pip_log = tmp_path / "pip.jsonl"
    (site / "pip").mkdir()
    (site / "pip" / "__init__.py").write_text('"""Stands in for pip: records the command, installs nothing."""\n')
    (site / "pip" / "__main__.py").write_text(textwrap.dedent(f"""\
        import json, sys
        with open({str(pip_log)!r}, "a") as log:
            log.write(json.dumps(sys.argv[1:]) + "\\n")
        print("pip stand-in: recorded", *sys.argv[1:])
        """))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("pip", "pip3"):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pip "$@"\n')
        (bin_dir / name).chmod(0o755)
    ipython_dir = tmp_path / "ipython"
    (ipython_dir / "profile_default" / "startup").mkdir(parents=True)
    (ipython_dir / "profile_default" / "startup" / "00-colab.py").write_text("import google.colab\n")
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text(f'[url "{REPO.as_uri()}"]\n\tinsteadOf = {repository_url}\n')
    content = tmp_path / "content"
    content.mkdir()

    monkeypatch.setenv("PYTHONPATH", str(site))  # and nothing else: utils must come from the clone
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin")
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("BOOK_COMMIT", raising=False)  # the provenance must read the clone's commit
    return {"content": content, "pip_log": pip_log}


def first_cells(notebook):
    """The notebook's cells up to and including its `parameters` cell, and the first code cell."""
    nb = json.loads(notebook.read_text())
    tagged = [i for i, c in enumerate(nb["cells"]) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert tagged, f"{notebook.name} has no cell tagged `parameters`"
    nb["cells"] = nb["cells"][:tagged[0] + 1]
    return nb, code_cells(nb)[0]


def test_there_are_chapters():
    assert NOTEBOOKS, "no notebooks/[0-9]*.ipynb"


@pytest.mark.slow  # a kernel per chapter: about 6 s each
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_cells_on_colab(notebook, colab, checkout, repository_url):
    import nbformat
    from nbclient import NotebookClient

    nb, setup = first_cells(notebook)
    source = "".join(setup["source"])
    assert '"google.colab" in sys.modules' in source, "the first code cell has no Colab branch"
    clone = re.search(rf"!git clone .*{re.escape(repository_url)}\s+(\S+)", source)
    assert clone, f"the first code cell does not `!git clone` {repository_url} into a folder"
    clone_dir = colab["content"] / clone.group(1).removeprefix(COLAB_ROOT)
    assert clone.group(1).startswith(COLAB_ROOT), f"the clone goes to {clone.group(1)}, not under {COLAB_ROOT}"

    for cell in code_cells(nb):
        cell["source"] = "".join(cell["source"]).replace(COLAB_ROOT, f"{colab['content']}/")
        cell["outputs"], cell["execution_count"] = [], None
    nb["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                        "source": "import json, sys\nimport utils\n"
                                  f"print({REPORT!r} + json.dumps({{'utils': utils.__file__, "
                                  "'colab': 'google.colab' in sys.modules, 'preset': PRESET}))"})
    nb = nbformat.from_dict(nb)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(colab["content"])}})
    client.execute()

    def text_of(cell):
        return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")

    printed = text_of(next(c for c in nb.cells if c.cell_type == "code"))  # the set-up cell's output
    errors = [f"{o['ename']}: {o['evalue']}" for c in nb.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{notebook.name} on Colab: {errors}\nthe set-up cell printed:\n{printed}"
    report = [line for line in text_of(nb.cells[-1]).splitlines() if line.startswith(REPORT)]
    assert report, f"the check cell printed: {text_of(nb.cells[-1])!r}"
    report = json.loads(report[0][len(REPORT):])

    # utils came from the clone, which holds a commit of this checkout (its HEAD when cloned)
    assert report["colab"] is True
    assert Path(report["utils"]).resolve() == (clone_dir / "utils" / "__init__.py").resolve(), \
        f"utils was imported from {report['utils']}, not from the clone in {clone_dir}"
    cloned = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone_dir, capture_output=True, text=True,
                            check=True).stdout.strip()
    known = subprocess.run(["git", "cat-file", "-e", f"{cloned}^{{commit}}"], cwd=checkout, capture_output=True)
    assert known.returncode == 0, f"the clone holds {cloned}, which this checkout does not have"
    assert report["preset"] == "auto", "the parameters cell does not keep PRESET = \"auto\""

    # the set-up cell printed the provenance, with the clone's commit
    fields = dict(re.findall(r"^\s*([\w ]+?):\s(.*)$", printed, re.M))
    for key in ("gpu", "torch", "python", "date", "commit"):
        assert key in fields, f"the set-up cell's provenance has no {key!r}: {printed!r}"
    import torch
    assert fields["torch"].strip() == torch.__version__
    assert cloned.startswith(fields["commit"].strip()), f"provenance commit {fields['commit']!r}, clone at {cloned[:12]}"

    # what it asked pip for: never torch, only what requirements.txt lists, with its pins
    recorded = [json.loads(line) for line in colab["pip_log"].read_text().splitlines()] \
        if colab["pip_log"].exists() else []
    pins = requirements()
    for args in recorded:
        for req in installs(args):
            name = canonicalize_name(req.name)
            assert name not in NEVER_INSTALL, f"the set-up cell installs {req}: Colab's own torch must stay"
            assert name in pins, f"the set-up cell installs {req}, which requirements.txt does not list"
            exact = [s.version for s in pins[name].specifier if s.operator == "=="]
            for version in exact:
                assert req.specifier.contains(version, prereleases=True), \
                    f"the set-up cell installs {req}; requirements.txt pins {pins[name]}"
