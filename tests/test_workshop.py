"""The workshop guide (book/workshop.md) and the run times it shows.

`python -m utils.run_book --simulate t4` records how each chapter's run went in
results/<gpu>/runs.json. The fast tests fake the papermill run (no kernel, no GPU: a fake H200) and
check the entries; draw the page's table and agenda times from a tiny fixture (tests/data/runs.json)
through utils/workshop.py and through the Sphinx extension (book/_ext/workshop_runs.py) in a small
Sphinx project; check that a broken runs file stops the build naming it; and check the page's links
to sections and exercises against the notebooks. The slow tests read the page in the book's own build
(_toc.yml lists it) and open it in Chromium.
"""
import datetime
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from docutils.nodes import make_id

import utils.run_book
from conftest import REPO, build_small_sphinx, open_page, page_problems
from utils import benchmarks, workshop
from utils.env import SIMULATE_ENV
from utils.run_book import ChapterFailed, ChapterPending
from utils.runs import PARTS_LOG_ENV

PAGE = REPO / "book" / "workshop.md"
PAGE_DOC = "book/workshop"
FIXTURE = Path(__file__).parent / "data" / "runs.json"
SIMULATED = "Tesla T4 (simulated on NVIDIA H200)"
RUNS = Path("results") / "t4-simulated-on-h200" / "runs.json"


# --- recording: utils.run_book --simulate, with papermill faked ----------------------------------

@pytest.fixture
def runner(tmp_path, monkeypatch):
    """utils.run_book on a fake H200 whose papermill runs are played by the test: script[chapter] says what happens.

    A chapter's script is {"prints": text its cells print, "fails": reason, "pending": reason}; the fake
    run writes an executed copy holding the printed text, as papermill would, then returns or raises.
    """
    monkeypatch.setattr(utils.run_book, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(utils.run_book, "DEFAULT_OUT", tmp_path / "executed")
    monkeypatch.setenv(SIMULATE_ENV, "")  # main() sets it for the kernel; undone after the test
    monkeypatch.setenv("BOOK_COMMIT", "abc1234")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H200")
    script = {}

    def fake_execute(notebook, preset="auto", out_dir=None, timeout=None, *, seconds=None, resume=False, env=None):
        plan = script[Path(notebook).stem]
        target = Path(out_dir) / Path(notebook).name
        target.parent.mkdir(parents=True, exist_ok=True)
        outputs = [{"output_type": "stream", "name": "stdout", "text": plan.get("prints", "")}]
        target.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "", "outputs": outputs}]}))
        with open(os.environ[PARTS_LOG_ENV], "a") as log:  # what the kernel's utils.Run notes of each part
            log.writelines(json.dumps(line) + "\n" for line in plan.get("parts", []))
        if plan.get("fails"):
            failed = target.with_name(target.stem + ".failed.ipynb")
            target.replace(failed)
            raise ChapterFailed(plan["fails"], failed)
        if plan.get("pending"):
            raise ChapterPending(plan["pending"], target)
        return target

    monkeypatch.setattr(utils.run_book, "execute", fake_execute)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for stem in ("01_mechanism", "02_training", "03_inference"):
        (notebooks / f"{stem}.ipynb").write_text("{}")
    return SimpleNamespace(script=script, notebooks=notebooks, runs=tmp_path / RUNS, results=tmp_path / "results")


def recorded(runner):
    return json.loads(runner.runs.read_text())["runs"]


def run(runner, *args):
    return utils.run_book.main([*args, "--out", str(runner.notebooks.parent / "copies")])


def test_a_simulated_run_records_its_chapter(runner):
    runner.script["03_inference"] = {"prints": "preset workshop (Tesla T4 (simulated on NVIDIA H200) has 15 GB: ...)\n"}
    assert run(runner, "--simulate", "t4", "--preset", "workshop", str(runner.notebooks / "03_inference.ipynb")) == 0
    [entry] = recorded(runner)
    assert entry == {**entry, "chapter": "03_inference", "asked": "workshop", "preset": "workshop", "outcome": "done",
                     "reason": None, "commands": 1, "date": datetime.date.today().isoformat(), "commit": "abc1234",
                     "torch": torch.__version__, "gpu": SIMULATED, "real_gpu": "NVIDIA H200"}
    assert isinstance(entry["seconds"], float) and entry["seconds"] >= 0
    assert not list(runner.runs.parent.glob("*.tmp")), "the atomic write left its temporary file"
    assert workshop.read_runs(runner.runs) == [entry], "what the runner writes is what the guide reads"


def test_an_ordinary_run_records_nothing(runner):
    runner.script["03_inference"] = {"prints": "preset workshop (chosen by hand)\n"}
    assert run(runner, "--preset", "workshop", str(runner.notebooks / "03_inference.ipynb")) == 0
    assert not list(runner.notebooks.parent.rglob("runs.json"))


def test_the_preset_recorded_is_the_one_the_chapter_ran(runner):
    """A chapter without workshop sizes falls back to smoke and prints so: the entry says smoke, asked workshop."""
    runner.script["02_training"] = {"prints": "setting up\npreset smoke on cuda (bf16 autocast): {'n': 2}\n"}
    run(runner, "--simulate", "t4", "--preset", "workshop", str(runner.notebooks / "02_training.ipynb"))
    assert [(r["asked"], r["preset"]) for r in recorded(runner)] == [("workshop", "smoke")]


def test_a_failed_chapter_is_recorded_as_failed_with_its_reason(runner, capsys):
    runner.script["01_mechanism"] = {"prints": "preset workshop (chosen by hand)\n",
                                     "fails": "OutOfMemoryError: CUDA out of memory.\nTried to allocate 2 GiB"}
    runner.script["03_inference"] = {"prints": "", "fails": "ModuleNotFoundError: No module named 'transformers'"}
    chapters = [str(runner.notebooks / f"{c}.ipynb") for c in ("01_mechanism", "03_inference")]
    assert run(runner, "--simulate", "t4", "--preset", "workshop", *chapters) == 1
    assert "FAILED" in capsys.readouterr().out
    first, third = recorded(runner)
    assert (first["outcome"], first["reason"], first["preset"]) == ("failed", "OutOfMemoryError: CUDA out of memory.",
                                                                     "workshop")
    assert (third["outcome"], third["preset"]) == ("failed", None), "it stopped before printing its preset"
    assert third["reason"] == "ModuleNotFoundError: No module named 'transformers'"


def test_a_rerun_replaces_its_entry_and_other_presets_keep_theirs(runner):
    chapter = str(runner.notebooks / "01_mechanism.ipynb")
    runner.script["01_mechanism"] = {"prints": "preset workshop (chosen by hand)\n", "fails": "RuntimeError: boom"}
    run(runner, "--simulate", "t4", "--preset", "workshop", chapter)
    runner.script["01_mechanism"] = {"prints": "preset workshop (chosen by hand)\n"}
    run(runner, "--simulate", "t4", "--preset", "colab", chapter)
    assert [(r["asked"], r["outcome"]) for r in recorded(runner)] == [("colab", "done"), ("workshop", "failed")]
    run(runner, "--simulate", "t4", "--preset", "workshop", chapter)
    assert [(r["asked"], r["outcome"]) for r in recorded(runner)] == [("colab", "done"), ("workshop", "done")]


def test_a_chapter_resumed_over_two_commands_records_their_total(runner):
    chapter = str(runner.notebooks / "01_mechanism.ipynb")
    runner.script["01_mechanism"] = {"prints": "preset workshop (chosen by hand)\n", "pending": "part 'modes' next"}
    command = ["--simulate", "t4", "--preset", "workshop", "--resume", chapter]
    assert run(runner, *command) == utils.run_book.EXIT_PENDING
    [pending] = recorded(runner)
    assert (pending["outcome"], pending["reason"], pending["commands"]) == ("pending", "part 'modes' next", 1)
    runner.script["01_mechanism"] = {"prints": "preset workshop (chosen by hand)\n"}
    assert run(runner, *command) == 0
    [done] = recorded(runner)
    assert (done["outcome"], done["commands"]) == ("done", 2)
    assert done["seconds"] >= pending["seconds"]
    assert "uninterrupted_seconds" not in pending, "an unfinished run has no time for the whole chapter"


def test_a_finished_run_adds_the_parts_it_reused_to_its_uninterrupted_time(runner, capsys):
    """One run top to bottom: this command's wall time plus the measuring time of the parts reused from earlier ones."""
    chapter = str(runner.notebooks / "01_mechanism.ipynb")
    runner.script["01_mechanism"] = {"prints": "preset workshop (chosen by hand)\n", "parts": [
        {"part": "modes", "how": "reused", "seconds": 300.0}, {"part": "regimes", "how": "reused", "seconds": 45.5},
        {"part": "backends", "how": "measured", "seconds": 1000.0}]}
    assert run(runner, "--simulate", "t4", "--preset", "workshop", "--resume", chapter) == 0
    [done] = recorded(runner)
    assert 345.5 <= done["uninterrupted_seconds"] - done["seconds"] < 345.6, "reused parts added, measured ones not"
    printed = re.search(r"one uninterrupted run: (\d+) s", capsys.readouterr().out)
    assert printed and abs(int(printed.group(1)) - done["uninterrupted_seconds"]) <= 1, "the runner's line says it too"
    assert PARTS_LOG_ENV not in os.environ and not list(Path(tempfile.gettempdir()).glob("01_mechanism-parts-*")), \
        "the parts log is the run's own: gone after it"


# --- reading and drawing: utils/workshop.py ------------------------------------------------------

def make_repo(tmp_path, runs_text=None, chapters=("notebooks/01_mechanism", "notebooks/04_gnn")):
    """A repository with a toc listing `chapters`, a notebook for each chapter named in the fixture, and a runs file."""
    toc = {"format": "jb-book", "root": "index", "parts": [{"caption": "Chapters",
                                                             "chapters": [{"file": c} for c in chapters]}]}
    (tmp_path / "_toc.yml").write_text(yaml.safe_dump(toc))
    (tmp_path / "notebooks").mkdir()
    for stem in ("01_mechanism", "02_training", "03_inference", "04_gnn", "05_diffusion"):
        (tmp_path / "notebooks" / f"{stem}.ipynb").write_text("{}")
    if runs_text is not None:
        (tmp_path / RUNS).parent.mkdir(parents=True)
        (tmp_path / RUNS).write_text(runs_text)
    return tmp_path


def test_with_no_runs_the_page_says_the_times_are_not_measured(tmp_path):
    repo = make_repo(tmp_path)
    text = workshop.runs_markdown(repo)
    assert text == workshop.NO_RUNS and "not been measured yet" in text
    assert not re.search(r"\d", text), "no placeholder number"
    assert workshop.minutes_text(workshop.workshop_run([], "01_mechanism")) == "not measured yet"


def test_the_table_shows_every_recorded_run(tmp_path):
    repo = make_repo(tmp_path, FIXTURE.read_text())
    table, legend = workshop.runs_markdown(repo).split("\n\n")
    assert legend == workshop.LEGEND
    lines = table.splitlines()
    assert lines[0] == "```{container} benchmarks-table" and lines[-1] == "```"
    assert lines[1] == "| chapter | preset asked | sizes it ran | minutes | outcome | GPU | torch | date |"
    rows = lines[3:-1]
    assert rows[0] == (f"| [chapter 1](../notebooks/01_mechanism.ipynb) | workshop | workshop | 5.2 | done | {SIMULATED} "
                       "| 2.11.0+cu130 | 2026-12-05 |")
    assert rows[1].startswith("| chapter 2 | workshop | smoke | 1.6 | done |"), "a chapter not in the toc is not linked"
    assert "| failed: `OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB` |" in rows[2]
    assert "| 8.8 | done over 2 commands (11.7 min in all) |" in rows[3], "the time of one uninterrupted run first"
    assert rows[4].startswith("| [chapter 4](../notebooks/04_gnn.ipynb) | colab | workshop | 7.0 | unfinished: `part ")


@pytest.mark.parametrize("chapter, text", [("01_mechanism", "6 min"), ("02_training", "2 min (smoke sizes)"),
                                           ("03_inference", "failed"), ("04_gnn", "9 min"),
                                           ("05_diffusion", "not measured yet")])
def test_an_agenda_shows_each_chapters_workshop_run(chapter, text):
    runs = workshop.read_runs(FIXTURE)
    assert workshop.minutes_text(workshop.workshop_run(runs, chapter)) == text


def load_extension():
    sys.path.insert(0, str(REPO / "book" / "_ext"))
    import workshop_runs

    return workshop_runs


@pytest.mark.parametrize("text, says", [
    ("", "empty"),
    ('{"runs": [', "not valid JSON"),
    ("[1, 2]", "not a runs file"),
    (json.dumps({"runs": [{"chapter": "01_mechanism", "asked": "workshop"}]}), "run 0 lacks 'preset'"),
    (json.dumps({"runs": [{f: "x" for f in workshop.FIELDS}]}), "run 0 has outcome 'x'"),
], ids=["empty", "broken-json", "not-a-dict", "entry-without-fields", "bad-outcome"])
def test_a_bad_runs_file_stops_the_build_naming_it(tmp_path, text, says):
    repo = make_repo(tmp_path, text)
    with pytest.raises(workshop.RunsError) as caught:
        workshop.runs_markdown(repo)
    assert RUNS.as_posix() in str(caught.value) and says in str(caught.value)
    from sphinx.errors import ExtensionError

    with pytest.raises(ExtensionError, match=re.escape(RUNS.as_posix())):
        load_extension().check_runs(SimpleNamespace(srcdir=str(repo)))


def test_the_benchmarks_page_does_not_read_runs_files(tmp_path):
    repo = make_repo(tmp_path, FIXTURE.read_text())
    (repo / "results" / "t4-simulated-on-h200" / "01_mechanism.json").write_text("{}")
    assert [p.name for p in benchmarks.results_files(repo / "results")] == ["01_mechanism.json"]


ROLE_ROWS = ("| one | {workshop-minutes}`01_mechanism` |\n"
             "| two | {workshop-minutes}`02_training` |\n"
             "| three | {workshop-minutes}`04_gnn colab` |\n")


def sphinx_page(tmp_path, runs_text, rows=ROLE_ROWS):
    """Build a one-page Sphinx project that uses the directive and the role; its HTML and warnings."""
    repo = make_repo(tmp_path, runs_text, chapters=())  # no chapter pages here: the table names them unlinked
    (repo / "index.md").write_text(f"# Runs\n\n| block | run |\n|---|---|\n{rows}\n```{{workshop-runs}}\n```\n")
    warnings = io.StringIO()
    out = build_small_sphinx(repo, ["myst_parser", "workshop_runs"], warning=warnings)
    return (out / "index.html").read_text(), warnings.getvalue()


def test_the_directive_and_role_draw_the_recorded_runs_in_sphinx(tmp_path):
    page, warnings = sphinx_page(tmp_path, FIXTURE.read_text())
    assert not warnings, warnings
    assert '<span class="workshop-minutes">6 min</span>' in page
    assert '<span class="workshop-minutes">2 min (smoke sizes)</span>' in page
    assert '<span class="workshop-minutes">unfinished</span>' in page, "chapter 4's colab run, by the preset named"
    assert page.count("<tr") >= 6, "the table of runs, with its header and five runs"


def test_the_role_warns_of_a_preset_no_run_as_a_small_gpu_records(tmp_path):
    page, warnings = sphinx_page(tmp_path, FIXTURE.read_text(), rows="| one | {workshop-minutes}`01_mechanism full` |\n")
    assert "workshop-minutes: preset 'full' is not one the runner records as a small GPU" in warnings
    assert '<span>not measured yet</span>' in page, "what the role shows in place of a time"
    assert SIMULATED in page and "done over 2 commands" in page


def test_with_no_runs_the_sphinx_page_says_so(tmp_path):
    page, warnings = sphinx_page(tmp_path, None)
    assert not warnings, warnings
    assert "have not been measured yet" in page
    assert page.count('<span class="workshop-minutes">not measured yet</span>') == 3


def test_each_chapter_states_its_times_on_a_small_gpu():
    """Each chapter's "Time:" line gives its simulated T4 time in the workshop and the colab preset, from the runs."""
    for path in sorted((REPO / "notebooks").glob("[0-9]*.ipynb")):
        time_line = re.search(r"\*\*Time:\*\*(.*?)(\n\n|$)", notebook_markdown(path.stem), re.S).group(1)
        for role in (f"{{workshop-minutes}}`{path.stem}`", f"{{workshop-minutes}}`{path.stem} colab`"):
            assert role in time_line, f"{path.stem}: no {role} in its Time line"


# --- the page: its prose, links and agendas --------------------------------------------------------

def notebook_markdown(stem):
    nb = json.loads((REPO / "notebooks" / f"{stem}.ipynb").read_text())
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def section_anchors(stem):
    """The anchors of a chapter's headings, as the build makes them (docutils' make_id of the text without its number)."""
    headings = re.findall(r"^#{1,6} +(?:\d+[a-z]?\. +)?(.+)$", notebook_markdown(stem), re.M)
    return {make_id(h.replace("`", "")) for h in headings}


def exercise_titles():
    """{label: title} of every exercise of every chapter."""
    titles = {}
    for path in (REPO / "notebooks").glob("[0-9]*.ipynb"):
        for title, label in re.findall(r"`{3,}\{exercise\} *(.*)\n:label: *([\w-]+)", notebook_markdown(path.stem)):
            titles[label] = title.strip()
    return titles


def test_the_page_links_sections_that_exist():
    links = re.findall(r"\]\(\.\./notebooks/(\w+)\.ipynb#([\w-]+)\)", PAGE.read_text())
    assert len(links) > 10
    missing = [f"{stem}#{anchor}" for stem, anchor in links if anchor not in section_anchors(stem)]
    assert not missing, f"links to sections that no chapter has: {missing}"


def test_the_page_names_each_exercise_by_its_title():
    refs = re.findall(r"\{ref\}`([^`<]+?) *<(ex-[\w-]+)>`", PAGE.read_text())
    titles = exercise_titles()
    assert len(refs) > 5
    wrong = [(label, text) for text, label in refs if titles.get(label) != text]
    assert not wrong, f"exercises named otherwise than their titles (or missing): {wrong}"


def test_the_chapters_an_agenda_runs_have_workshop_sizes():
    """A chapter whose run an agenda times runs in the workshop preset: it defines those sizes."""
    chapters = set(re.findall(r"\{workshop-minutes\}`(\w+)`", PAGE.read_text()))
    assert chapters
    for stem in chapters:
        nb = json.loads((REPO / "notebooks" / f"{stem}.ipynb").read_text())
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        assert re.search(r'^\s*"workshop": *\{', code, re.M), f"{stem} has no workshop preset"


def test_the_page_leaves_the_times_to_the_recorded_runs():
    text = PAGE.read_text()
    assert text.count("```{workshop-runs}") == 1
    assert not re.search(r"\d+(\.\d+)? *(min|minutes|s)\b", text), "a typed-in time"


# --- the built page ---------------------------------------------------------------------------------

def test_the_toc_lists_the_page():
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    using = next(p for p in toc["parts"] if p.get("caption") == "Using this book")
    assert PAGE_DOC in [c["file"] for c in using["chapters"]]


@pytest.mark.slow
def test_the_workshop_page_builds_with_its_agendas_and_times(built_site):
    page = (built_site / f"{PAGE_DOC}.html").read_text()
    assert re.search(r"<h1>Workshops: a class on torch\.compile", page)
    runs = workshop.gather_runs(REPO / "results")
    shown = re.findall(r'<span class="workshop-minutes">([^<]*)</span>', page)
    expected = {workshop.minutes_text(workshop.workshop_run(runs, stem))
                for stem in re.findall(r"\{workshop-minutes\}`(\w+)`", PAGE.read_text())}
    assert shown and set(shown) == expected
    if runs:
        assert "Tesla T4 (simulated on" in page
    else:
        assert "have not been measured yet" in page
    for label in re.findall(r"<(ex-[\w-]+)>`", PAGE.read_text()):
        assert re.search(rf'href="[^"]*#{label}"', page), f"no link to the exercise {label}"
    chapter = (built_site / "notebooks" / "04_gnn.html").read_text()
    times = re.findall(r'<span class="workshop-minutes">([^<]*)</span>', chapter)
    assert times == [workshop.minutes_text(workshop.workshop_run(runs, "04_gnn", preset))
                     for preset in ("workshop", "colab")], "a chapter's Time line shows its recorded runs"


@pytest.mark.slow
def test_the_workshop_page_opens_cleanly_in_a_browser(browser, site):
    from selenium.webdriver.common.by import By

    open_page(browser, f"{site}/{PAGE_DOC}.html")
    heading = browser.find_element(By.CSS_SELECTOR, "article h1")
    assert heading.is_displayed() and heading.text.startswith("Workshops:")
    assert "Workshops" in browser.title
    tables = browser.find_elements(By.CSS_SELECTOR, "article table")
    assert len(tables) >= 2 and all(t.is_displayed() for t in tables), "the two agendas"
    boxes = browser.find_elements(By.CSS_SELECTOR, "article input[type=checkbox]")
    assert boxes, "the set-up checklist"
    problems = {k: v for k, v in page_problems(browser, site).items() if v}
    assert not problems, problems
