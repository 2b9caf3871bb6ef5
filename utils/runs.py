"""A chapter's measurements in named parts, stored as each finishes, so a long run can resume (chapter 1).

A notebook measures through `Run.part(name, measure)`. Run top to bottom by a reader, a part is
simply measured. Run by `python -m utils.run_book --resume`, each part is stored in
results/<gpu>/parts/<chapter>.json as soon as it finishes and reused by later commands while its
key holds: the same chapter, part, preset sizes, GPU, torch, and the same code (the measuring
function, what it calls in the notebook, and the library's timing code). A part that would not
finish before the command's deadline is not started (its time is its last measurement's on this GPU; a
part new to this GPU may take 1.5x its time on another): the notebook stops with PartsPending and the
runner carries on in its next command. A part cut off mid-way is never stored; one cut off twice with a
command to itself is an error (PartTooLong): it cannot finish within one command.
"""
import datetime
import hashlib
import html
import importlib.util  # (binds importlib too)
import inspect
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

from .env import REPO_ROOT, gpu_name, gpu_slug, git_commit, is_simulated, provenance

RESUME_ENV = "BOOK_RESUME"  # "1": reuse stored parts and store new ones
DEADLINE_ENV = "BOOK_DEADLINE"  # epoch seconds after which no part may still be running
REKEY_ENV = "BOOK_REKEY_FROM"  # a folder holding the measuring code as it was when the stored parts were measured
ADOPT_ENV = "BOOK_ADOPT"  # JSON list of parts whose stored results stand under the current key (run_book --adopt)
PARTS_LOG_ENV = "BOOK_PARTS_LOG"  # a file the kernel appends each part's line to, for run_book to read after the run
MEASURING_CODE = ("compare.py", "timing.py", "compiler.py")  # a change here re-measures every part


class PartTooLong(RuntimeError):
    """A part that did not finish even with a whole command to itself, twice: it must be made smaller (chapter 1)."""


class PartsPending(Exception):
    """A part does not fit in what is left of this command: the runner measures it in its next one (chapter 1)."""


def parts_path(chapter, gpu=None, root=None):
    """Where a chapter's stored parts live: results/<gpu-slug>/parts/<chapter>.json (chapter 1)."""
    return Path(root or REPO_ROOT / "results") / gpu_slug(gpu) / "parts" / f"{chapter}.json"


ELSEWHERE_MARGIN = 1.5  # a part not yet measured on this GPU may take up to 1.5x its time on another


def seconds_elsewhere(chapter, name, root=None):
    """The longest a part took where it finished on another GPU (simulated ones only for simulated), or 0.0 (chapter 1)."""
    here, longest = gpu_slug(), 0.0
    for path in Path(root or REPO_ROOT / "results").glob(f"*/parts/{chapter}.json"):
        gpu = path.parent.parent.name
        if gpu == here or is_simulated(gpu) != is_simulated(here):
            continue
        try:
            entry = json.loads(path.read_text()).get("parts", {}).get(name) or {}
        except (OSError, ValueError, AttributeError):
            continue
        if "result" in entry:
            longest = max(longest, float(entry.get("seconds") or 0.0))
    return longest


def _code_text(code):
    """A stable text for a code object: its bytecode, names and constants (nested code objects alike)."""
    consts = [_code_text(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return repr((code.co_code, code.co_names, consts))


def _source(obj):
    """The source text of a function or class, or its bytecode where no source is kept."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        code = getattr(obj, "__code__", None)
        return _code_text(code) if code else getattr(obj, "__qualname__", type(obj).__name__)


def _stable_repr(obj):
    """Text for an object inside data that JSON cannot hold: a function's or class's code, else its repr without
    a memory address (which differs from process to process, so a key holding one would never match again)."""
    if inspect.isfunction(obj) or inspect.isclass(obj):
        return _source(obj)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


def _value_text(value):
    """A stable text for data a measuring function reads (sizes, configurations), or None to leave it out."""
    if isinstance(value, (bool, int, float, str, type(None), torch.dtype, torch.device)):
        return repr(value)
    if isinstance(value, (list, tuple, dict)):
        try:
            return json.dumps(value, sort_keys=True, default=_stable_repr)
        except (TypeError, ValueError):
            return None
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}:{value.dtype}"
    return None


def _names(code):
    """Every global or attribute name a code object reads, nested functions, lambdas and comprehensions included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _in_library(module_name, old):
    """Whether a module belongs to the book's library (utils), or in a re-key to its old copy."""
    top = (module_name or "").split(".")[0]
    return top == "utils" or (old is not None and top == old.__name__)


def _as_it_was(obj, old):
    """obj as the old copy of the library has it, where obj is the library's; else obj itself.

    Every library function is read from the copy (not only the measuring files' ones), so that a
    function reached by two paths is one object there, as it was in the old library.
    """
    module = getattr(obj, "__module__", None) or ""
    if old is None or module.split(".")[0] != "utils":
        return obj
    try:
        found = importlib.import_module(old.__name__ + module[len("utils"):])
    except ImportError:
        return obj
    for name in getattr(obj, "__qualname__", "").split("."):
        found = getattr(found, name, None)
    return found if found is not None else obj


def code_text(fn, depth=3, seen=None, old=None):
    """The code a part's measurement depends on: fn's source, and what it reads from the notebook and utils (chapter 1).

    `old` (a re-key) is a copy of the library with the old measuring files: its functions are read from it.
    """
    seen = set() if seen is None else seen
    fn = _as_it_was(fn, old)
    if id(fn) in seen or depth < 0:
        return ""
    seen.add(id(fn))
    texts = [_source(fn)]
    code, fn_globals = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
    if code is None or fn_globals is None:
        return texts[0]
    names = _names(code)
    referenced = {n: fn_globals[n] for n in names if n in fn_globals}
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            referenced[name] = cell.cell_contents
        except ValueError:  # a cell not yet filled
            pass
    from_notebook = getattr(fn, "__module__", None) in ("__main__", "__mp_main__")
    for name in sorted(referenced):
        value = referenced[name]
        if isinstance(value, types.ModuleType):
            if _in_library(value.__name__, old):  # attributes it uses of the book's library
                for attr in sorted(n for n in names if "." not in n):  # "a.b" is an import's module path
                    member = getattr(value, attr, None)
                    if inspect.isfunction(member) or inspect.isclass(member):
                        texts.append(code_text(member, depth - 1, seen, old))
        elif inspect.isfunction(value) or inspect.isclass(value):
            module = getattr(value, "__module__", "") or ""
            if _in_library(module, old) or module in ("__main__", "__mp_main__"):
                texts.append(code_text(value, depth - 1, seen, old))
        elif from_notebook:  # data the notebook defines: sizes, configurations
            text = _value_text(value)
            if text is not None:
                texts.append(f"{name} = {text}")
    return "\n".join(texts)


def measuring_code(folder=None):
    """The library's timing and comparison code (as it is, or as kept in `folder`), part of every part's key (chapter 1)."""
    here = Path(folder) if folder else Path(__file__).resolve().parent
    return "\n".join((here / name).read_text() for name in MEASURING_CODE)


def old_library(folder):
    """The library as it was: a copy of utils/ with the measuring files kept in `folder`, imported apart (chapter 1)."""
    name = "utils_before_" + hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:8]
    if name not in sys.modules:
        copy = Path(tempfile.mkdtemp(prefix="book-rekey-")) / name
        shutil.copytree(Path(__file__).resolve().parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
        for file in MEASURING_CODE:
            shutil.copy(Path(folder) / file, copy / file)
        spec = importlib.util.spec_from_file_location(name, copy / "__init__.py", submodule_search_locations=[str(copy)])
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def part_key(chapter, name, preset, sizes, measure, old_folder=None, also=()):
    """A hash of all that decides a part's result: chapter, part, preset and sizes, GPU, torch, code (chapter 1).

    With `old_folder`, the key the part had when the measuring files were those kept there (a re-key).
    `also`: modules whose whole source joins the key, for code the part runs in another process
    (a worker or a server started with `python -m`), which no function it calls refers to.
    """
    what = json.dumps({"chapter": chapter, "part": name, "preset": preset, "sizes": sizes, "gpu": gpu_name(),
                       "torch": torch.__version__}, sort_keys=True, default=repr)
    old = old_library(old_folder) if old_folder else None
    code = code_text(measure, old=old) + measuring_code(old_folder) + "".join(inspect.getsource(m) for m in also)
    return hashlib.sha256((what + code).encode()).hexdigest()[:16]


def _finite(value):
    """The value with NaN and infinities replaced by None, which JSON can hold."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def as_json(value, name):
    """The value as JSON would give it back (NaN and infinities as null), so stored and measured parts look alike (chapter 1)."""
    try:
        return json.loads(json.dumps(_finite(value), allow_nan=False))
    except (TypeError, ValueError) as error:
        raise TypeError(f"part {name!r} returned something that is not JSON data (rows of numbers and text): "
                        f"{error}") from None


class Run:
    """One chapter's run: measures or reuses its parts, and says how each was made (chapter 1)."""

    def __init__(self, chapter, preset, sizes, root=None):
        self.chapter, self.preset, self.sizes = chapter, preset, sizes
        self.resume = os.environ.get(RESUME_ENV) == "1"
        self.deadline = float(os.environ[DEADLINE_ENV]) if os.environ.get(DEADLINE_ENV) else None
        self.rekey_from = os.environ.get(REKEY_ENV) or None
        self.adopt = set(json.loads(os.environ.get(ADOPT_ENV) or "[]"))
        self.root, self.path = root, parts_path(chapter, root=root)
        self.log = []  # one entry per part: name, how (measured or reused), seconds, commit, date
        self.started = time.perf_counter()

    def stored(self):
        """The parts stored for this chapter and GPU: {name: entry} (chapter 1)."""
        if not self.path.exists():
            return {}
        return json.loads(self.path.read_text()).get("parts", {})

    def _store(self, name, entry):
        """Write one part's entry (None: remove it) at once (a later crash keeps it), atomically."""
        parts = self.stored()
        if entry is None:
            parts.pop(name, None)
        else:
            parts[name] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"chapter": self.chapter, "gpu": gpu_name(), "parts": parts}, indent=1) + "\n")
        tmp.replace(self.path)

    def _check_time(self, name, entry, key):
        """Raise PartsPending when the part's expected seconds (its last measurement's, or elsewhere's) do not fit."""
        if self.deadline is None:
            return
        left = self.deadline - time.time()
        expected = (entry or {}).get("seconds") or 0.0
        cut_off = (entry or {}).get("key") == key and "attempt_started" in (entry or {})
        measured_before = any(p["how"] == "measured" for p in self.log)
        if cut_off and measured_before:  # this very code was cut off before: it gets a command's first turn
            raise PartsPending(f"part {name!r} of {self.chapter} was cut off by the end of a command before: "
                               "it is measured first in the next one")
        if expected > left:
            raise PartsPending(f"part {name!r} of {self.chapter} needs about {expected:.0f} s and "
                               f"{max(left, 0):.0f} s are left in this command: the runner measures it next")
        if measured_before and not expected:  # a command's first part always starts: it has the whole command
            elsewhere = seconds_elsewhere(self.chapter, name, self.root)
            if ELSEWHERE_MARGIN * elsewhere > left:
                raise PartsPending(f"part {name!r} of {self.chapter} is new on this GPU and took up to "
                                   f"{elsewhere:.0f} s on another; {max(left, 0):.0f} s are left "
                                   "in this command: the runner measures it next")

    def _cut_off_alone(self, name, entry, key):
        """How often this very code was cut off with a command to itself; raise PartTooLong at the second time."""
        entry = entry or {}
        if entry.get("key") != key or "attempt_started" not in entry:
            return 0
        times = entry.get("cut_off_alone", 0) + (1 if entry.get("alone") else 0)
        if times >= 2:
            raise PartTooLong(f"part {name!r} of {self.chapter} was cut off {times} times when it was the first part "
                              "measured in its command: it does not finish within one command. Make it smaller "
                              "(fewer sizes or a smaller model) or split it into parts; nothing of it is published")
        return times

    def part(self, name, measure, also=()):
        """measure()'s result for this part: reused when stored with the same key, else measured (and stored) (chapter 1).

        `also`: modules the part runs in other processes, whose source is part of its key (see part_key).
        """
        key = part_key(self.chapter, name, self.preset, self.sizes, measure, also=also)
        entry = self.stored().get(name) if self.resume else None
        if self.rekey_from:
            entry = self._rekeyed(name, entry, key, measure, also)
        elif name in self.adopt:
            entry = self._adopted(name, entry, key)
        if entry and entry.get("key") == key and "result" in entry:
            self._log({"part": name, "how": "reused", **{k: entry.get(k) for k in ("seconds", "commit", "date")}})
            return entry["result"]
        self._check_time(name, entry, key)
        if self.resume:
            alone = not any(p["how"] == "measured" for p in self.log)  # nothing measured before it in this command
            self._store(name, {"key": key, "attempt_started": time.time(), "alone": alone,
                               "cut_off_alone": self._cut_off_alone(name, entry, key),
                               "seconds": (entry or {}).get("seconds", 0.0)})
        started = time.perf_counter()
        try:
            result = as_json(measure(), name)
        except Exception:  # a failure, not a cut-off (the runner's stop is not an Exception): the attempt is forgotten
            if self.resume:
                self._store(name, entry)
            raise
        seconds = time.perf_counter() - started
        commit, date = git_commit(), datetime.date.today().isoformat()
        if self.resume:
            self._store(name, {"key": key, "seconds": seconds, "commit": commit, "date": date,
                               "torch": torch.__version__, "result": result})
        self._log({"part": name, "how": "measured", "seconds": seconds, "commit": commit, "date": date})
        return result

    def _log(self, line):
        """Note how a part was made, here and, for the runner, in $BOOK_PARTS_LOG (one JSON line each)."""
        self.log.append(line)
        if os.environ.get(PARTS_LOG_ENV):
            with open(os.environ[PARTS_LOG_ENV], "a") as log:
                log.write(json.dumps(line) + "\n")

    def _rekeyed(self, name, entry, key, measure, also=()):
        """The stored entry under the new key when only the measuring code changed since it was measured, else an error.

        A re-key run (BOOK_REKEY_FROM) measures nothing: it recomputes each stored part's old key with
        the measuring code kept in that folder (the whole files, and the functions of theirs the part
        calls, read from an old copy of the library); where that equals the stored key, everything else
        the part depends on is unchanged, so its result stands and is stored under the new key.
        """
        if not entry or "result" not in entry:  # a re-key measures nothing, not even a part cut off midway
            raise RuntimeError(f"part {name!r} of {self.chapter} cannot be re-keyed: nothing is stored for it; "
                               "measure it (run without --rekey-from)")
        if entry.get("key") == key:
            return entry
        old = part_key(self.chapter, name, self.preset, self.sizes, measure, old_folder=self.rekey_from, also=also)
        if entry.get("key") != old:
            raise RuntimeError(f"part {name!r} of {self.chapter} cannot be re-keyed: more than the measuring code "
                               "changed since it was measured; measure it (run without --rekey-from)")
        entry = {**entry, "key": key, "rekeyed_from": old}
        self._store(name, entry)
        return entry

    def _adopted(self, name, entry, key):
        """The stored entry under the current key, kept with the key it had (run_book --adopt), or an error.

        For a maintainer who has checked that the part's code is unchanged since it was measured but its
        stored key can no longer be computed (a key that held a memory address, before keys were stable).
        """
        if not entry or "result" not in entry:
            raise RuntimeError(f"part {name!r} of {self.chapter} cannot be adopted: no result is stored for it")
        if entry.get("key") != key:
            entry = {**entry, "key": key, "adopted_from": entry.get("key")}
            self._store(name, entry)
        return entry

    def minutes(self):
        """How long the chapter takes top to bottom: this render's time plus what the reused parts took (chapter 1)."""
        reused_s = sum(p.get("seconds") or 0.0 for p in self.log if p["how"] == "reused")
        return (time.perf_counter() - self.started + reused_s) / 60

    def provenance(self, **versions):
        """This run's provenance, with each part's commit and date (chapter 1)."""
        return {**provenance(self.preset), **versions, "parts": self.log}

    def save(self, rows, **versions):
        """Write results/<gpu>/<chapter>.json from a full run; other presets write nothing (chapter 1)."""
        from .results import save_results

        if self.preset != "full":
            return None
        return save_results(self.chapter, rows, self.provenance(**versions), root=self.root)

    def about(self, why=None, **versions):
        """The collapsed 'About this run' box: hardware, versions, preset, and how each part was made (chapter 1)."""
        from IPython.display import HTML, display

        prov = self.provenance(**versions)
        facts = [(k, prov.get(k)) for k in ("gpu", "capability", "torch", "triton", "python", "date", "preset")]
        facts += [(k, v) for k, v in versions.items()]
        if why:
            facts.append(("why this preset", why))
        fact_rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                            for k, v in facts if v is not None)
        part_rows = "".join(
            f"<tr><td>{html.escape(p['part'])}</td><td>{p['how']}</td><td>{p.get('seconds') or 0:.0f}</td>"
            f"<td>{html.escape(str(p.get('commit')))}</td><td>{html.escape(str(p.get('date')))}</td></tr>"
            for p in self.log)
        reused = sum(p["how"] == "reused" for p in self.log)
        parts = ("" if not self.log else
                 f"<p>{len(self.log)} measured parts; {reused} reused from an earlier command of the same run "
                 "(same code, sizes, GPU and torch).</p><table><tr><th>part</th><th>how</th><th>seconds</th>"
                 f"<th>commit</th><th>date</th></tr>{part_rows}</table>")
        display(HTML(f'<details class="about-run"><summary>About this run</summary>'
                     f"<table>{fact_rows}</table>{parts}</details>"))
