"""The workshop guide's run times: how long each chapter ran as a small GPU, read from results/<gpu>/runs.json.

`python -m utils.run_book --simulate t4 ...` records one entry per chapter and preset asked
(utils/run_book.py, record_run). When the book is built, book/_ext/workshop_runs.py reads them
through this module (which imports no torch) for the workshop guide (book/workshop.md): the table
of every recorded run, and each chapter's time in the workshop preset inside the agendas. A runs
file that is empty, not JSON, or holds an entry without its fields stops the build with an error
naming the file. With no runs file, the page says that the times have not been measured yet.
"""
import math
from pathlib import Path

from .benchmarks import (RUNS_FILE, SKIPPED_FOLDERS, _cell, _code, chapter_label, chapter_link, read_json_file, table,
                         toc_chapters)

FIELDS = ("chapter", "asked", "preset", "outcome", "seconds", "date", "commit", "torch", "gpu")
OUTCOMES = ("done", "failed", "pending")
AGENDA_PRESET = "workshop"  # the preset a class runs its chapters in
SIMULATED_PRESETS = ("workshop", "colab")  # the presets whose times the chapters show, from runs as a T4
NOT_MEASURED = "not measured yet"
NO_RUNS = ("The chapters' times in the workshop preset have not been measured yet: no simulated run is recorded "
           "in `results/`.")
LEGEND = ("The **preset asked** is what the runner was told to run; **sizes it ran** is the preset the chapter printed "
          "that it used, since a chapter without the sizes asked for runs the next smaller ones it has. **minutes** is "
          "the time one run of the whole chapter takes, top to bottom. A chapter that the runner finished over several "
          "commands shows its last command's wall time plus the measuring time of the parts it reused from the "
          "earlier ones; the outcome gives the commands' total, which also counts kernel starts and any part cut off "
          "at a command's end and measured again.")


class RunsError(Exception):
    """A runs file the guide cannot be built from; the message names the file (workshop guide)."""


def runs_files(root):
    """Every results/<gpu>/runs.json under `root`, CPU runs left out (workshop guide)."""
    return sorted(p for p in Path(root).glob(f"*/{RUNS_FILE}") if p.parent.name not in SKIPPED_FOLDERS)


def read_runs(path):
    """A runs file's entries; RunsError naming the file when it is not one (workshop guide)."""
    path = Path(path)
    data = read_json_file(path, "runs", RunsError)
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise RunsError(f"{path}: not a runs file (it needs a list 'runs')")
    for i, run in enumerate(data["runs"]):
        missing = [f for f in FIELDS if not isinstance(run, dict) or f not in run]
        if missing:
            raise RunsError(f"{path}: run {i} lacks {', '.join(repr(f) for f in missing)}")
        if run["outcome"] not in OUTCOMES or not isinstance(run["seconds"], (int, float)):
            raise RunsError(f"{path}: run {i} has outcome {run['outcome']!r} and seconds {run['seconds']!r} "
                            f"(an outcome of {', '.join(OUTCOMES)} and a number of seconds expected)")
    return data["runs"]


def gather_runs(root):
    """Every recorded run under `root`, each with the file it came from (workshop guide)."""
    return [{**run, "file": path.as_posix()} for path in runs_files(root) for run in read_runs(path)]


def workshop_run(runs, chapter, preset=AGENDA_PRESET):
    """The chapter's latest recorded run asked for `preset` (the workshop preset unless named), or None (workshop guide)."""
    found = [r for r in runs if r["chapter"] == chapter and r["asked"] == preset]
    return max(found, key=lambda r: r["date"]) if found else None


def uninterrupted_seconds(run):
    """How long one run of the chapter takes top to bottom: recorded by the runner for a finished run, else its wall time (workshop guide)."""
    return run.get("uninterrupted_seconds") or run["seconds"]


def minutes_text(run):
    """A chapter's run time for an agenda: '7 min', '2 min (smoke sizes)', 'failed', 'unfinished', 'not measured yet' (workshop guide)."""
    if run is None:
        return NOT_MEASURED
    if run["outcome"] != "done":
        return {"failed": "failed", "pending": "unfinished"}[run["outcome"]]
    text = f"{math.ceil(uninterrupted_seconds(run) / 60)} min"
    return text if run["preset"] in (None, run["asked"]) else f"{text} ({run['preset']} sizes)"


def outcome_text(run):
    """How a recorded run ended, with its reason or the number of commands it took (workshop guide)."""
    if run["outcome"] == "done":
        commands = run.get("commands") or 1
        return "done" if commands == 1 else f"done over {commands} commands ({run['seconds'] / 60:.1f} min in all)"
    word = {"failed": "failed", "pending": "unfinished"}[run["outcome"]]
    return f"{word}: {_code(run['reason'])}" if run.get("reason") else word  # code: the error's text, literally


def runs_markdown(repo):
    """The recorded runs as a MyST Markdown table and its legend, or a sentence saying there are none yet (workshop guide)."""
    repo = Path(repo)
    runs = gather_runs(repo / "results")
    if not runs:
        return NO_RUNS
    chapters = toc_chapters(repo)
    lines = [[chapter_link({"stem": r["chapter"], "chapter": chapter_label(r["chapter"])}, chapters, short=False),
              _cell(r["asked"]), _cell(r["preset"] or "-"), f"{uninterrupted_seconds(r) / 60:.1f}", outcome_text(r),
              _cell(r["gpu"]), _cell(r["torch"]), _cell(r["date"])] for r in runs]
    headers = ["chapter", "preset asked", "sizes it ran", "minutes", "outcome", "GPU", "torch", "date"]
    return f"{table(headers, lines)}\n\n{LEGEND}"
