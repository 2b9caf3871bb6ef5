"""Run the book's chapters with papermill, on this machine, and say where each result went.

    python -m utils.run_book                                  # every chapter, preset auto
    python -m utils.run_book notebooks/01_mechanism.ipynb     # one chapter
    python -m utils.run_book --preset smoke --out /tmp/run    # a quick check, into copies
    python -m utils.run_book --resume --max-seconds 540 notebooks/01_mechanism.ipynb

A chapter is written in place only by a successful run in the full preset; any other run (smoke,
or a chapter that failed) goes to --out (default _build/executed), so the committed chapters keep
their measurements. With --resume, each measured part of a chapter is stored as soon as it
finishes (results/<gpu>/parts/) and reused by the next command, so a chapter whose measurements
need longer than one command is driven to completion over several: when one command's
--max-seconds run out, run the same command again. The chapter is rendered once, by the run in
which every part was present.

A run as a small GPU (--simulate t4) records each chapter's outcome in
results/<gpu>/runs.json, e.g. results/t4-simulated-on-h200/runs.json: the preset asked and the one
in force, done, failed or pending, the wall seconds, the date, commit, torch and GPU. The workshop
guide (book/workshop.md) shows them.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .benchmarks import RUNS_FILE, SKIPPED_FOLDERS
from .env import REPO_ROOT, SIMULATE_ENV, SMALL_GPUS, git_commit, gpu_name, gpu_slug, is_simulated
from .runs import ADOPT_ENV, MEASURING_CODE, PARTS_LOG_ENV, REKEY_ENV

NOTEBOOKS = REPO_ROOT / "notebooks"
DEFAULT_OUT = REPO_ROOT / "_build" / "executed"
PRESETS = ("auto", "full", "colab", "workshop", "smoke")
PENDING = "PartsPending"  # the exception a notebook stops with when its next part needs another command
EXIT_PENDING = 3  # run the same command again: parts are stored, more remain
PRESET_LINE = re.compile(r"^preset (full|colab|workshop|smoke)\b", re.M)  # every chapter prints it once it has its sizes


class ChapterStopped(Exception):
    """A chapter's run that did not finish: why, in a line, and the executed copy it left, if any (chapter 1)."""

    def __init__(self, reason, executed=None):
        super().__init__(reason)
        self.reason, self.executed = reason, executed


class ChapterFailed(ChapterStopped):
    """A chapter's run stopped on an error (its message names the cell's exception) (chapter 1)."""

    def __str__(self):
        return f"{self.reason} (the failed run: {self.executed})" if self.executed else self.reason


class ChapterPending(ChapterStopped):
    """A resumable run stored what it could and needs another command (chapter 1)."""


def auto_preset():
    """What PRESET='auto' means here, as the notebooks resolve it (chapter 1)."""
    from .env import choose_preset

    return choose_preset()[0]


MACHINE_PATHS = ("input_path", "output_path")  # papermill's record of where the run read and wrote: the runner's folders


def strip_injected(path):
    """Remove papermill's injected parameters cell and its record of the run's paths; PRESET = "auto" stays (chapter 1)."""
    nb = json.loads(Path(path).read_text())
    nb["cells"] = [c for c in nb["cells"] if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    for key in MACHINE_PATHS:
        nb.get("metadata", {}).get("papermill", {}).pop(key, None)
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def _kill_tree(proc):
    """Stop a process and every process it started (the kernel runs in a session of its own)."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=30)


def _error_of(path):
    """The first error output in an executed notebook, as 'Name: message', or None."""
    try:
        nb = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"{out.get('ename')}: {out.get('evalue')}"
    return None


def execute(notebook, preset="auto", out_dir=None, timeout=None, *, seconds=None, resume=False, env=None, cwd=None):
    """Run one notebook top to bottom with PRESET set, in a papermill subprocess; returns the executed copy's path (chapter 1).

    `timeout` bounds each cell; `seconds` the whole run (it is stopped, kernel and all, after that).
    The kernel runs in `cwd` (default: the notebook's folder), which is where its relative paths start.
    The copy goes to out_dir (or a temporary folder) with papermill's injected cell removed.
    Raises ChapterPending when a resumable run stopped to continue in the next command, and
    ChapterFailed when a cell raised.
    """
    notebook = Path(notebook).resolve()
    if not notebook.exists():
        raise FileNotFoundError(f"No notebook at {notebook}")
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}: choose one of {', '.join(PRESETS)}.")
    out_dir = Path(out_dir).resolve() if out_dir else Path(tempfile.mkdtemp(prefix="run_book-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / notebook.name
    run_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    if resume:
        run_env["BOOK_RESUME"] = "1"
        if seconds:
            run_env["BOOK_DEADLINE"] = str(time.time() + seconds)
    cmd = [sys.executable, "-m", "papermill", str(notebook), str(target), "-p", "PRESET", preset,
           "--cwd", str(cwd or notebook.parent), "-k", "python3", "--no-progress-bar", "--log-level", "WARNING"]
    if timeout:
        cmd += ["--execution-timeout", str(int(timeout))]
    proc = subprocess.Popen(cmd, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = proc.communicate(timeout=seconds + 30 if seconds else None)
    except subprocess.TimeoutExpired:  # the deadline passed inside a part: nothing of that part was stored
        _kill_tree(proc)
        left = target if target.exists() else None
        if resume:
            raise ChapterPending(f"stopped after {seconds:.0f} s inside a part", left) from None
        raise ChapterFailed(f"still running after {seconds:.0f} s", left) from None
    error = _error_of(target)
    if error and error.startswith(PENDING) and resume:
        raise ChapterPending(error.split(": ", 1)[-1], target)
    if proc.returncode != 0 or error:
        last_line = log.strip().splitlines()[-1] if log.strip() else f"papermill exited {proc.returncode}"
        failed = target.with_name(target.stem + ".failed.ipynb")
        if target.exists():
            target.replace(failed)
        raise ChapterFailed(error or last_line, failed if failed.exists() else None)
    strip_injected(target)
    return target


def retire_other_gpus(chapter):
    """Remove a chapter's results files from other GPUs once its page shows this GPU's run; returns them (benchmarks page)."""
    here, removed = gpu_slug(), []
    for path in sorted((REPO_ROOT / "results").glob(f"*/{chapter}.json")):
        gpu = path.parent.name  # the page skips results/cpu; a simulated small GPU records its own runs
        if gpu != here and gpu not in SKIPPED_FOLDERS and not is_simulated(gpu):
            path.unlink()
            removed.append(path)
    return removed


def run_chapter(notebook, preset, out_dir=None, *, resume=False, seconds=None, timeout=None):
    """Run one chapter and put it where it belongs: in place for a full run, else under out_dir; returns where (chapter 1)."""
    notebook = Path(notebook).resolve()
    resolved = auto_preset() if preset == "auto" else preset
    simulated = bool(os.environ.get(SIMULATE_ENV))  # a run as a small GPU never replaces the published one
    in_place = out_dir is None and resolved == "full" and not simulated
    target_dir = Path(out_dir) if out_dir else (notebook.parent if in_place else DEFAULT_OUT)
    work_dir = DEFAULT_OUT / "work"  # the run writes here; a failed run stays here to be read
    executed = execute(notebook, preset, work_dir, timeout, seconds=seconds, resume=resume)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / notebook.name
    if target.resolve() != executed.resolve():
        target.write_text(executed.read_text())
        executed.unlink()
    for path in retire_other_gpus(notebook.stem) if in_place else ():
        print(f"{notebook.name}: removed {path}, an earlier GPU's run: the chapter and the benchmarks page "
              f"now show this one's", flush=True)
    return target, resolved


def preset_in_force(executed):
    """The preset a chapter ran in, from the line it prints when it has its sizes ('preset NAME ...'), or None before that (chapter 1)."""
    try:
        nb = json.loads(Path(executed).read_text())
    except (OSError, TypeError, ValueError):
        return None
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            match = PRESET_LINE.search("".join(out.get("text", ""))) if out.get("output_type") == "stream" else None
            if match:
                return match.group(1)
    return None


def runs_path(gpu=None, root=None):
    """Where runs as a small GPU are recorded: results/<gpu-slug>/runs.json, e.g. results/t4-simulated-on-h200/ (chapter 1)."""
    return Path(root or REPO_ROOT / "results") / gpu_slug(gpu) / RUNS_FILE


def reused_seconds(parts_log):
    """The measuring seconds of the parts a run reused from earlier commands, read from its parts log (chapter 1)."""
    path = Path(parts_log)
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return sum(line.get("seconds") or 0.0 for line in lines if line.get("how") == "reused")


def run_entry(chapter, asked, outcome, seconds, executed=None, reason=None, reused_s=0.0):
    """One chapter's run as the workshop guide reads it: presets asked and in force, outcome, seconds, provenance (chapter 1).

    A finished run also gets `uninterrupted_seconds`: its own wall time plus the measuring time of the
    parts it reused from earlier commands, which is what one run top to bottom takes.
    """
    entry = {"chapter": chapter, "asked": asked, "preset": preset_in_force(executed) if executed else None,
             "outcome": outcome, "reason": reason.strip().splitlines()[0][:200] if reason else None,
             "seconds": round(seconds, 1), "commands": 1, "date": datetime.date.today().isoformat(),
             "commit": git_commit(), "torch": torch.__version__, "gpu": gpu_name(),
             "real_gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    if outcome == "done":
        entry["uninterrupted_seconds"] = round(seconds + reused_s, 1)
    return entry


def record_run(entry, path, resumed=False):
    """Write one run's entry into the runs file, replacing the chapter's entry for the same preset asked, atomically (chapter 1).

    A resumed run that follows a pending one adds that one's seconds and commands to its own.
    """
    path, key = Path(path), (entry["chapter"], entry["asked"])
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    earlier = next((r for r in runs if (r["chapter"], r["asked"]) == key), None)
    if resumed and earlier and earlier["outcome"] == "pending":
        entry = {**entry, "seconds": round(entry["seconds"] + earlier["seconds"], 1),
                 "commands": earlier.get("commands", 1) + 1}
    runs = sorted([r for r in runs if (r["chapter"], r["asked"]) != key] + [entry],
                  key=lambda r: (r["chapter"], r["asked"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    tmp.replace(path)
    return entry


def main(argv=None):
    """Command line: which notebooks, which preset, where to write, and whether to resume (chapter 1)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="default: every notebooks/[0-9]*.ipynb")
    parser.add_argument("--preset", default="auto", choices=PRESETS,
                        help="auto picks by the hardware found (default auto)")
    parser.add_argument("--out", help=f"folder for executed copies (default: in place for a successful full run, "
                                      f"else {os.path.relpath(DEFAULT_OUT, REPO_ROOT)})")
    parser.add_argument("--resume", action="store_true",
                        help="store each measured part as it finishes and reuse stored ones")
    parser.add_argument("--max-seconds", type=float,
                        help="with --resume: stop starting parts after this many seconds; run again to go on")
    parser.add_argument("--rekey-from", metavar="FOLDER",
                        help="with --resume: measure nothing; keep each stored part whose key differs only by the "
                             "measuring code, which FOLDER holds as it was (compare.py, timing.py, compiler.py)")
    parser.add_argument("--adopt", action="append", default=[], metavar="PART",
                        help="with --resume: keep this part's stored result under the current key (repeatable); "
                             "only for a part whose code you have checked is unchanged since it was measured")
    parser.add_argument("--simulate", choices=sorted(SMALL_GPUS),
                        help="run as if on this small GPU (memory capped, its dtype, two compile threads); "
                             "the copies go under --out, never in place")
    args = parser.parse_args(argv)
    if args.simulate:
        os.environ[SIMULATE_ENV] = args.simulate  # the kernel inherits it
    if args.max_seconds and not args.resume:
        parser.error("--max-seconds needs --resume (a run stopped without it keeps nothing)")
    if args.rekey_from:
        missing = [name for name in MEASURING_CODE if not (Path(args.rekey_from) / name).is_file()]
        if not args.resume or missing:
            parser.error("--rekey-from needs --resume and a folder with the old " + ", ".join(MEASURING_CODE)
                         + (f" (missing: {', '.join(missing)})" if missing else ""))
        os.environ[REKEY_ENV] = str(Path(args.rekey_from).resolve())  # the kernel inherits it
    if args.adopt:
        if not args.resume or args.rekey_from:
            parser.error("--adopt needs --resume, and goes without --rekey-from")
        os.environ[ADOPT_ENV] = json.dumps(args.adopt)  # the kernel inherits it
    notebooks = [Path(nb) for nb in args.notebooks] or sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    missing = [str(nb) for nb in notebooks if not nb.exists()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    started, status = time.time(), 0
    for nb in notebooks:
        left = None if args.max_seconds is None else args.max_seconds - (time.time() - started)
        if left is not None and left <= 30:
            print(f"{nb.name}: not started, this command's time is spent; run it again with --resume", flush=True)
            status = EXIT_PENDING
            continue
        t0 = time.time()
        parts_log = Path(tempfile.mkstemp(prefix=f"{nb.stem}-parts-", suffix=".jsonl")[1])
        os.environ[PARTS_LOG_ENV] = str(parts_log)  # the kernel inherits it and notes each part there
        try:
            target, resolved = run_chapter(nb, args.preset, args.out, resume=args.resume, seconds=left)
            outcome, reason, executed = "done", None, target
        except ChapterPending as pending:
            print(f"{nb.name}: parts stored, more to measure ({pending}); run the same command again", flush=True)
            status, outcome, reason, executed = EXIT_PENDING, "pending", pending.reason, pending.executed
        except ChapterFailed as failed:
            print(f"{nb.name}: FAILED after {time.time() - t0:.0f} s: {str(failed)[:2000]}; "
                  "the committed notebook is unchanged", flush=True)
            status, outcome, reason, executed = 1, "failed", failed.reason, failed.executed
        seconds, reused_s = time.time() - t0, reused_seconds(parts_log)
        os.environ.pop(PARTS_LOG_ENV, None)
        parts_log.unlink(missing_ok=True)
        if os.environ.get(SIMULATE_ENV):  # how long each chapter takes on a small GPU, for the workshop guide
            entry = run_entry(nb.stem, args.preset, outcome, seconds, executed, reason, reused_s=reused_s)
            record_run(entry, runs_path(entry["gpu"]), resumed=args.resume)
        if outcome != "done":
            continue
        where = "in place" if target.parent == nb.resolve().parent else f"to {target}"
        note = "" if where == "in place" else " (only a full run replaces the committed chapter)"
        whole = f" (with the parts it reused, one uninterrupted run: {seconds + reused_s:.0f} s)" if reused_s else ""
        print(f"{nb.name}: {resolved} run done in {seconds:.0f} s{whole}, written {where}{note}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
