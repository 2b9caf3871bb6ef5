"""The chapters: they run on a CPU in the smoke preset, and their committed outputs are a clean GPU run."""
import ast
import json
import re
from pathlib import Path

import pytest

from conftest import REPO
from utils.benchmarks import SKIPPED_FOLDERS
from utils.env import is_simulated

NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9]*.ipynb"))
IDS = [nb.stem for nb in NOTEBOOKS]
ALL_NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))  # drafts too
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# the provenance printout, e.g. "       gpu: NVIDIA H200" or "'gpu': 'NVIDIA H200'"
GPU_LINE = re.compile(r"""\bgpu['"]?\s*:\s*['"]?NVIDIA\b""", re.IGNORECASE)
GPU_NAME = re.compile(r"""\bgpu['"]?\s*:\s*['"]?(NVIDIA[^'"\\\n<]*)""")  # the GPU's name in that printout
SMOKE_CELL_TIMEOUT_S = 1800
# What a chapter's smoke run must print besides running clean: checks of that chapter's own (regexes).
SMOKE_PRINTS = {
    "02_training": [r"resnet batch 2, default: [\d.]+ ms, [\d.]+x \(rounds",  # ResNet against eager in rounds
                    r"resnet batch 2, reduce-overhead: skipped: .*needs a GPU",  # the GPU-only mode says so on a CPU
                    r"micro-batches x 3 steps: 1 graph compiled",  # accumulation did not recompile
                    r"tensor lr: 1 graph in",  # a tensor lr compiles once
                    r"regional: [\d.]+ ms, .* 1 graph,",  # one graph serves every block
                    r"batch 8, max-autotune-no-cudagraphs: [\d.]+ ms"],
    "03_inference": [r"loop-default:\s+[\d,.]+ tok/s = .* of the roofline, [\d.]+x eager in the same rounds",
                     r"loop-cudagraphs-cd: skipped: CUDA graphs",  # the GPU-only variant says so on a CPU
                     r"mark_dynamic: first call \(s\) at lengths"],  # the recompile study ran
    "03b_quantized_decode": [r"loop-default:\s+[\d,.]+ tok/s = .* of its roofline, [\d.]+x eager loop",
                             r"int8-default:\s+[\d,.]+ tok/s = .* of its roofline, [\d.]+x loop-default",
                             r"int8-kernel-default:\s+[\d,.]+ tok/s = .* of its roofline, [\d.]+x loop-default",
                             r"int4-tinygemm-default:\s+[\d,.]+ tok/s = .* of its roofline, [\d.]+x loop-default",
                             r"int8-cudagraphs-cd: skipped: coordinate-descent tuning",  # GPU-only, says so on a CPU
                             r"int8-max-autotune: skipped",
                             r"int4, over \d+ forced steps: .* same next token in [\d.]+% of the steps",
                             r"Dropdown\(description='weights'",  # the Try-it panel was shown
                             r"panel: [\d.]+ tok/s"],  # and measures through its function (SMOKE_EXTRA)
    "04_gnn": [r"step\+one CUDA graph\s+.*skipped: a CUDA graph needs a GPU"],  # the GPU-only variant says so on a CPU
    "05b_diffusion_serving": [r"hotswap: swap .* 0 new graph",  # hotswap kept the compiled blocks
                              r"new adapter: swap .* [1-9]\d* new graph",  # the plain swap recompiled
                              r"whole UNet, static at\s+128: 0 graph breaks, 0 recompiles; first call",
                              r"repeated blocks, dynamic=None \(default\) at\s+64: [1-9]\d* new graph",
                              r"repeated blocks, dynamic=None \(default\) at\s+128: 0 new graph",  # dynamic by then
                              r"repeated blocks, dynamic=True at\s+96: 0 new graph"],  # one compile serves all
    "05c_diffusion_tuning": [r"\bdefault: +[\d.]+ ms per step, [\d.]+x .*eager, compile +[\d.]+ s",
                             r"diffusers settings: +[\d.]+ ms per step, [\d.]+x .*eager, compile +[\d.]+ s",
                             r"max-autotune-no-cudagraphs: skipped: max-autotune's search over Triton templates "
                             r"runs on a GPU"],  # the GPU-only variant says so on a CPU
}
# Code a chapter's smoke run appends after its solutions' code: what its page leaves to a reader's click.
SMOKE_EXTRA = {
    "03b_quantized_decode": ['print(f"panel: {panel_tok_s(\'int8\', \'default\'):.1f} tok/s")'],  # the Try-it panel
}


def load(path):
    return json.loads(path.read_text())


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def output_text(output):
    """The text an output shows: stream text, or the text/plain of a result or display."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")
    else:
        text = output.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


def errors(nb):
    """(cell index, 'ename: evalue') for every error output."""
    return [(i, f"{o.get('ename')}: {o.get('evalue')}") for i, c in enumerate(nb["cells"])
            if c["cell_type"] == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]


def glue_used(nb):
    """Names the markdown cells insert with {glue} roles."""
    prose = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return set(re.findall(r"\{glue(?::\w+)?\}`([^`:]+)", prose))


def glue_stored(nb):
    """Names the code cells' outputs glued (myst-nb's scrapbook metadata)."""
    return {o["metadata"]["scrapbook"]["name"] for c in code_cells(nb) for o in c.get("outputs", [])
            if o.get("metadata", {}).get("scrapbook")}


def unexecuted(nb):
    """Indexes of code cells with no execution_count (never run)."""
    return [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c.get("execution_count") is None]


# Names of the run-window logic that belongs to the runner (utils.runs), never to a notebook.
RUN_WINDOW_PLUMBING = ("Budget(", "time_left", "deadline(", "compute_or_load", "needs_s", "time_budget_s", "stored_rows")


def assert_no_plumbing(text):
    """Assert a notebook's text names none of the run-window plumbing."""
    found = [name for name in RUN_WINDOW_PLUMBING if name in text]
    assert not found, f"run-window plumbing in the notebook: {found}"


def check_draft_shape(path, repository_url):
    """Assert a draft notebook has the chapter shape and no outputs; its (code source, prose)."""
    nb = load(path)
    assert (nb["nbformat"], nb["nbformat_minor"]) == (4, 5) and nb["metadata"]["kernelspec"]["name"] == "python3"
    assert all(c.get("id") for c in nb["cells"])
    code = code_cells(nb)
    first = "".join(code[0]["source"])
    assert "google.colab" in first and f"!git clone --depth 1 {repository_url}" in first
    tagged = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1 and re.search(r'^PRESET = "auto"', "".join(tagged[0]["source"]), re.M)
    assert not any(c.get("outputs") or c.get("execution_count") for c in code), "the draft is committed without outputs"
    prose = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "{exercise}" in prose and "{solution}" in prose and ":class: dropdown" in prose
    return "".join("".join(c["source"]) for c in code), prose


SOLUTION = re.compile(r"(`{3,4})\{solution\}[^\n]*\n(.*?)\n\1(?=\s|$)", re.S)  # a {solution} block, any fence
PYTHON_BLOCK = re.compile(r"```python\n(.*?)\n```", re.S)


def solution_code(nb):
    """The Python code blocks in the notebook's exercise solutions, in order."""
    prose = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return [code for _, body in SOLUTION.findall(prose) for code in PYTHON_BLOCK.findall(body)]


def with_solutions(path, folder, extra=()):
    """A copy of the notebook with its solutions' code (and any extra code) appended as cells, for a smoke run."""
    nb = load(path)
    for i, code in enumerate([*solution_code(nb), *extra]):
        nb["cells"].append({"cell_type": "code", "execution_count": None, "id": f"solution-code-{i}",
                            "metadata": {"tags": ["solution-code"]}, "outputs": [], "source": code})
    copy = Path(folder) / "with-solutions" / path.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(json.dumps(nb))
    return copy


def smoke_run(path, tmp_path, timeout, extra=()):
    """Execute the notebook, its solutions' code (and extra code) appended, in the smoke preset; the executed copy's path."""
    from utils.run_book import execute

    executed = execute(with_solutions(path, tmp_path, extra), preset="smoke", out_dir=tmp_path, timeout=timeout,
                       cwd=path.parent)
    ran = [c for c in code_cells(load(executed)) if "solution-code" in c["metadata"].get("tags", [])]
    assert len(ran) == len(solution_code(load(path))) + len(extra), "the solutions' code was not all appended to the run"
    return executed


def misquoted_glue(nb):
    """Glued values the prose uses that the site would show otherwise than recorded, or with Markdown in them."""
    from myst_nb.core.variables import format_plain_text

    used = glue_used(nb)
    wrong = []
    for cell in code_cells(nb):
        for output in cell.get("outputs", []):
            scrapbook = output.get("metadata", {}).get("scrapbook")
            if not scrapbook or scrapbook.get("name") not in used:  # only what the site shows
                continue
            prefix = scrapbook.get("mime_prefix", "")
            text = output.get("data", {}).get(prefix + "text/plain")
            if text is None:
                continue
            text = "".join(text) if isinstance(text, list) else text
            shown = format_plain_text(text, "s")
            try:
                value = ast.literal_eval(text)
            except (SyntaxError, ValueError):
                value = text
            if shown != text and not (isinstance(value, str) and shown == value):
                wrong.append(f"{scrapbook['name']}: glued {text!r}, the site shows {shown!r}")
            elif "`" in shown:
                wrong.append(f"{scrapbook['name']}: {shown!r} holds Markdown, which the site shows as it is")
    return wrong


def run_draft_smoke(path, tmp_path, extra=()):
    """Run a draft (its solutions' code and extra code after it) in the smoke preset on the CPU, assert it ran clean;
    (notebook, its text)."""
    nb = load(smoke_run(path, tmp_path, timeout=1800, extra=extra))
    assert not unexecuted(nb), f"code cells that did not run: {unexecuted(nb)}"
    assert not errors(nb), f"error outputs: {errors(nb)}"
    used, glued = glue_used(nb), glue_stored(nb)
    assert used and not used - glued, f"prose uses values never glued: {sorted(used - glued)}"
    assert not misquoted_glue(nb), f"glued values the site would misquote: {misquoted_glue(nb)}"
    streams = [o for c in code_cells(nb) for o in c.get("outputs", []) if o.get("output_type") == "stream"]
    text = "".join("".join(o["text"]) for o in streams)
    failures = re.findall(r".*: failed: .*", text)
    assert not failures, f"measurements failed in the smoke run: {failures}"
    noisy = [line for o in streams if o["name"] == "stderr" for line in "".join(o["text"]).splitlines()
             if re.search(r"(?i)\b(error|warning|traceback)\b", line)]
    assert not noisy, f"the smoke run printed what looks like errors: {noisy[:5]}"
    return nb, text


def test_solution_code_is_found_in_dropdown_solutions():
    nb = {"cells": [{"cell_type": "markdown", "source": [
        "```{exercise} One\n:label: ex-one\nDo it.\n```\n\n",
        "````{solution} ex-one\n:class: dropdown\nLike this:\n\n```python\nprint(1 + 1)\n```\n````\n\n",
        "```{solution} ex-two\n:class: dropdown\nNo code here: `x` only.\n```\n"]}]}
    assert solution_code(nb) == ["print(1 + 1)"]
    assert solution_code(load(REPO / "notebooks" / "01_mechanism.ipynb")), "chapter 1's graph-break solution has code"


def test_there_are_chapters():
    assert NOTEBOOKS, "no notebooks/[0-9]*.ipynb"


# (a) every chapter runs top to bottom on a CPU in the smoke preset ---------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_runs_in_smoke_preset_on_cpu(notebook, tmp_path, monkeypatch):
    """Every cell, then the code of every exercise's solution and of SMOKE_EXTRA, runs clean in the smoke preset."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # inherited by the papermill kernel
    executed = smoke_run(notebook, tmp_path, timeout=SMOKE_CELL_TIMEOUT_S, extra=SMOKE_EXTRA.get(notebook.stem, ()))
    assert executed.parent == tmp_path, "the committed notebook must not be overwritten"
    nb = load(executed)
    assert not unexecuted(nb), f"code cells that did not run: {unexecuted(nb)}"
    assert not errors(nb), f"error outputs: {errors(nb)}"
    injected = [c for c in code_cells(nb) if "injected-parameters" in c["metadata"].get("tags", [])]
    assert not injected, "the executed copy keeps papermill's injected parameters cell"
    params = [c for c in code_cells(nb) if "parameters" in c["metadata"].get("tags", [])]
    assert params and re.search(r'^PRESET = "auto"', "".join(params[0]["source"]), re.M), \
        "the parameters cell no longer says PRESET = \"auto\""
    used, glued = glue_used(nb), glue_stored(nb)
    assert not used - glued, f"the prose uses values the run never glued: {sorted(used - glued)}"
    assert not misquoted_glue(nb), f"glued values the site would misquote: {misquoted_glue(nb)}"
    text = "".join(output_text(o) for c in code_cells(nb) for o in c.get("outputs", []))
    assert re.search(r"\bpreset smoke\b", text), "the run did not print 'preset smoke': PRESET did not reach it"
    for pattern in SMOKE_PRINTS.get(notebook.stem, []):
        assert re.search(pattern, text), f"the smoke run did not print {pattern!r}"


# (b) the committed notebooks carry the outputs of a clean run on an NVIDIA GPU ---------------------

@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_committed_outputs_are_a_clean_gpu_run(notebook):
    nb = load(notebook)
    cells = code_cells(nb)
    assert cells, "no code cells"
    missing = unexecuted(nb)
    assert not missing, f"code cells without outputs of a run (execution_count is null): {missing}; " \
                        "run the chapter on a GPU (python -m utils.run_book) and commit it with its outputs"
    counts = [c["execution_count"] for c in cells]
    assert counts == sorted(counts) and len(set(counts)) == len(counts), \
        f"cells were not run once each, top to bottom: execution counts {counts}"
    assert not errors(nb), f"error outputs: {errors(nb)}"
    texts = [output_text(o) for c in cells for o in c.get("outputs", [])]
    assert any(GPU_LINE.search(t) for t in texts), \
        "no provenance printout naming an NVIDIA GPU ('gpu: NVIDIA ...') in the outputs"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_its_results_of_record_come_from_the_gpu_its_page_shows(notebook):
    """The benchmarks page reads results/<gpu>/<chapter>.json: one real GPU's, the one the chapter's outputs name."""
    texts = [output_text(o) for c in code_cells(load(notebook)) for o in c.get("outputs", [])]
    shown = {m.group(1).strip() for t in texts for m in GPU_NAME.finditer(t)}
    files = [p for p in (REPO / "results").glob(f"*/{notebook.stem}.json")
             if p.parent.name not in SKIPPED_FOLDERS and not is_simulated(p.parent.name)]
    recorded = {str(p.relative_to(REPO)): json.loads(p.read_text())["provenance"]["gpu"] for p in files}
    assert len(recorded) == 1 and set(recorded.values()) == shown, \
        f"the chapter shows a run on {shown}, the results of record are {recorded}: " \
        "a full run in place (python -m utils.run_book) leaves only its own GPU's"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_has_a_parameters_cell(notebook):
    tagged = [c for c in code_cells(load(notebook)) if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1, f"{len(tagged)} code cells tagged 'parameters' (papermill needs exactly one)"
    assert re.search(r"^PRESET\s*=", "".join(tagged[0]["source"]), re.M), "the parameters cell sets no PRESET"


def preset_names(nb):
    """The presets a chapter defines: the keys of its PRESETS literal and each PRESETS["name"] = ... after it."""
    names = set()
    for cell in code_cells(nb):
        if "PRESETS" not in "".join(cell["source"]):
            continue
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id == "PRESETS" and isinstance(node.value, ast.Dict):
                        names |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
                    if isinstance(target, ast.Subscript) and getattr(target.value, "id", None) == "PRESETS":
                        names.add(target.slice.value)
    return names


# chapters rewritten on branches that wait for their GPU runs (they define all four presets there), and the
# scaling draft, which needs several GPUs: none of a reader's small machines runs it
PRESETS_PENDING = {"05_diffusion", "draft-08_scaling"}


@pytest.mark.parametrize("notebook", ALL_NOTEBOOKS, ids=[nb.stem for nb in ALL_NOTEBOOKS])
def test_a_preset_for_every_kind_of_machine(notebook):
    """full (80 GB), colab (a T4's 15 GB), workshop (any GPU, minutes) and smoke (a CPU): auto picks among them."""
    if notebook.stem in PRESETS_PENDING:
        assert {"full", "smoke"} <= preset_names(load(notebook))
        return
    assert preset_names(load(notebook)) == {"full", "colab", "workshop", "smoke"}


@pytest.mark.parametrize("notebook", ALL_NOTEBOOKS, ids=[nb.stem for nb in ALL_NOTEBOOKS])
def test_no_injected_parameters_cell(notebook):
    """Committed notebooks keep PRESET = "auto": papermill's injected cell would pin the preset of one run."""
    injected = [i for i, c in enumerate(load(notebook)["cells"])
                if "injected-parameters" in c.get("metadata", {}).get("tags", [])]
    assert not injected, f"cells tagged injected-parameters (papermill's, from a run): {injected}; " \
                         "re-run the chapter with python -m utils.run_book, which strips them"


@pytest.mark.parametrize("notebook", ALL_NOTEBOOKS, ids=[nb.stem for nb in ALL_NOTEBOOKS])
def test_no_paths_of_the_machine_that_ran_it(notebook):
    """papermill records where a run read and wrote the notebook; those are the runner's folders, not the reader's."""
    record = load(notebook)["metadata"].get("papermill", {})
    paths = {key: record[key] for key in ("input_path", "output_path") if record.get(key)}
    assert not paths, f"papermill's paths from the run: {paths}; utils.run_book's strip_injected removes them"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_widget_state_is_stored(notebook):
    """The site renders widgets from the state stored in the notebook (papermill stores it)."""
    state = load(notebook)["metadata"].get("widgets", {}).get(WIDGET_STATE, {}).get("state")
    assert state, f"no stored widget state (metadata.widgets[{WIDGET_STATE!r}]): the site will show no widget"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_glued_values_show_as_recorded(notebook):
    """{glue:text} on the site shows what the notebook glued, for every value the prose uses.

    myst-nb passes a glued text/plain value through ast.literal_eval before showing it, so a bare
    string such as 5,591 would be shown as the tuple (5, 591); and it shows the text as it is, so
    Markdown in it (backticks around code) would show literally.
    """
    wrong = misquoted_glue(load(notebook))
    assert not wrong, "glued values the site would misquote:\n" + "\n".join(wrong)


# (c) the Colab set-up cell fetches this book's repository ----------------------------------------

@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_colab_setup_uses_the_repository_url(notebook, repository_url):
    first = "".join(code_cells(load(notebook))[0]["source"])
    assert "google.colab" in first, "the first code cell is not the Colab set-up"
    clones = [line for line in first.splitlines() if line.strip().startswith("!git clone")]
    assert clones, "the Colab set-up cell runs no `!git clone` (a commented-out clone fetches nothing)"
    urls = re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", "\n".join(clones))
    assert urls, "the Colab set-up cell fetches no GitHub repository"
    assert all(u.removesuffix(".git") == repository_url for u in urls), \
        f"the Colab set-up cell uses {urls}, _config.yml says {repository_url}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_no_warning_or_machine_path_shows_on_the_page(notebook):
    """stderr a page shows is teaching output (logs a section asks for), never a library's warning or a GPU machine's path."""
    shown = []
    for i, cell in enumerate(code_cells(load(notebook))):
        if set(cell["metadata"].get("tags", [])) & {"remove-stderr", "remove-output", "remove-cell"}:
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                text = "".join(output["text"])
                if re.search(r"Warning\b|Traceback|/site-packages/|/opt/", text):
                    shown.append(f"code cell {i}: {text.strip().splitlines()[0][:160]}")
    assert not shown, "stderr the page would show; tag the cell remove-stderr:\n" + "\n".join(shown)
