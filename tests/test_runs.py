"""The runner's parts (utils.runs): stored, reused while their key holds, re-measured when it does not,
never started past the deadline; and utils.run_book end to end on a tiny generated notebook."""
import itertools
import json
import linecache
import os
import time

import pytest

import utils
import utils.run_book
import utils.runs
from conftest import REPO
from utils.runs import PartsPending, Run

SIZES = {"n": 2, "batches": [1, 8]}
_cells = itertools.count()


@pytest.fixture
def resume(monkeypatch):
    """BOOK_RESUME=1 as the runner sets it, no deadline, and a fixed commit (no git call)."""
    monkeypatch.setenv("BOOK_RESUME", "1")
    monkeypatch.delenv("BOOK_DEADLINE", raising=False)
    monkeypatch.setenv("BOOK_COMMIT", "abc1234")


def new_run(tmp_path, preset="smoke", sizes=SIZES):
    return Run("tiny", preset, sizes, root=tmp_path)


def stored(tmp_path):
    """The parts file of chapter 'tiny' under tmp_path, as the runner left it."""
    return json.loads(utils.runs.parts_path("tiny", root=tmp_path).read_text())["parts"]


def counted(result):
    """A measure function returning `result`, and the list its calls are appended to."""
    calls = []

    def measure():
        calls.append(1)
        return result

    return measure, calls


def notebook_function(source, name="measure", **namespace):
    """Define `name` as a notebook cell does: module __main__, its source in linecache (as IPython keeps it)."""
    filename = f"/tmp/ipykernel_test/{next(_cells)}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__", **namespace}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


# --- reuse and re-measure ------------------------------------------------------------------------

def test_a_stored_part_is_reused_without_measuring_again(tmp_path, resume):
    measure, calls = counted({"median_ms": 1.5, "rows": [1, 2]})
    first = new_run(tmp_path)
    assert first.part("a", measure) == {"median_ms": 1.5, "rows": [1, 2]}
    entry = stored(tmp_path)["a"]
    assert entry["result"] == {"median_ms": 1.5, "rows": [1, 2]} and entry["commit"] == "abc1234"
    assert "attempt_started" not in entry  # the finished part replaced its attempt
    assert first.log[0]["how"] == "measured"

    second = new_run(tmp_path)  # the runner's next command
    assert second.part("a", measure) == {"median_ms": 1.5, "rows": [1, 2]}
    assert calls == [1], "a stored part with the same key was measured again"
    assert [(p["part"], p["how"], p["commit"]) for p in second.log] == [("a", "reused", "abc1234")]


def test_each_part_is_noted_in_the_runners_parts_log(tmp_path, resume, monkeypatch):
    """The kernel tells run_book how each part was made, so its record can add the reused parts' seconds."""
    log = tmp_path / "parts.jsonl"
    monkeypatch.setenv(utils.runs.PARTS_LOG_ENV, str(log))
    measure, calls = counted([1])
    new_run(tmp_path).part("a", measure)
    new_run(tmp_path).part("a", measure)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line["part"], line["how"]) for line in lines] == [("a", "measured"), ("a", "reused")]
    assert lines[1]["seconds"] == lines[0]["seconds"] == stored(tmp_path)["a"]["seconds"]
    assert utils.run_book.reused_seconds(log) == lines[1]["seconds"]
    assert utils.run_book.reused_seconds(tmp_path / "no such log") == 0.0


def test_without_resume_nothing_is_stored_or_reused(tmp_path, monkeypatch):
    monkeypatch.delenv("BOOK_RESUME", raising=False)
    monkeypatch.delenv("BOOK_DEADLINE", raising=False)
    measure, calls = counted([1])
    new_run(tmp_path).part("a", measure)
    new_run(tmp_path).part("a", measure)
    assert len(calls) == 2
    assert not utils.runs.parts_path("tiny", root=tmp_path).exists()


def test_a_part_with_other_measuring_source_is_measured_again(tmp_path, resume):
    v1 = notebook_function("def measure():\n    return SCALE * 2\n", SCALE=3)
    same = notebook_function("def measure():\n    return SCALE * 2\n", SCALE=3)
    v2 = notebook_function("def measure():\n    return SCALE * 4\n", SCALE=3)
    assert new_run(tmp_path).part("a", v1) == 6
    run = new_run(tmp_path)
    assert run.part("a", same) == 6 and run.log[-1]["how"] == "reused"  # the same code, redefined: reused
    run = new_run(tmp_path)
    assert run.part("a", v2) == 12 and run.log[-1]["how"] == "measured"
    assert stored(tmp_path)["a"]["result"] == 12


def test_a_part_whose_notebook_value_changed_is_measured_again(tmp_path, resume):
    source = "def measure():\n    return [SCALE, MODES]\n"
    assert new_run(tmp_path).part("a", notebook_function(source, SCALE=3, MODES=["default"])) == [3, ["default"]]
    run = new_run(tmp_path)
    assert run.part("a", notebook_function(source, SCALE=3, MODES=["default"])) == [3, ["default"]]
    assert run.log[-1]["how"] == "reused"
    run = new_run(tmp_path)
    assert run.part("a", notebook_function(source, SCALE=5, MODES=["default"])) == [5, ["default"]]
    run = new_run(tmp_path)
    assert run.part("a", notebook_function(source, SCALE=5, MODES=["max-autotune"])) == [5, ["max-autotune"]]
    assert run.log[-1]["how"] == "measured"


def test_a_part_whose_notebook_helper_changed_is_measured_again(tmp_path, resume):
    cell = "def helper():\n    return {}\n\ndef measure():\n    return helper()\n"
    assert new_run(tmp_path).part("a", notebook_function(cell.format(1))) == 1
    run = new_run(tmp_path)
    assert run.part("a", notebook_function(cell.format(2))) == 2 and run.log[-1]["how"] == "measured"


def test_a_dotted_import_inside_a_measure_that_uses_utils_is_keyed(tmp_path, resume):
    # `import email.utils` puts "email.utils" among the code's names; it is a module path, not an
    # attribute of the book's utils package to look up (utils' lazy loader would raise on it)
    import utils

    source = "def measure():\n    import email.utils\n    return [utils.tolerance is not None, email.utils.__name__]\n"
    assert new_run(tmp_path).part("a", notebook_function(source, utils=utils)) == [True, "email.utils"]


def test_a_value_read_inside_a_nested_function_is_part_of_the_key(tmp_path, resume):
    # a sweep written as a comprehension or with a lambda inside: the notebook's MODES is read by
    # nested code (in Python < 3.12 a list comprehension is a code object of its own)
    source = "def measure():\n    return [m for _ in [0] for m in MODES] + list(map(lambda b: b * K, [1]))\n"
    assert new_run(tmp_path).part("a", notebook_function(source, MODES=["default"], K=1)) == ["default", 1]
    run = new_run(tmp_path)
    assert run.part("a", notebook_function(source, MODES=["max-autotune"], K=1)) == ["max-autotune", 1], \
        "MODES changed, the stored part for the old MODES was reused"
    run = new_run(tmp_path)
    assert run.part("a", notebook_function(source, MODES=["max-autotune"], K=2)) == ["max-autotune", 2], \
        "K changed, the stored part for the old K was reused"


def lambdas_cell(body):
    """A notebook cell defining VARIANTS = {"x": <a lambda with this body>}, as chapter 3b's sweep does."""
    return notebook_function(f"VARIANTS = {{'x': ['int8', lambda model: {body}]}}\n", name="VARIANTS")


def test_a_function_held_in_notebook_data_is_keyed_by_its_code_not_its_address(tmp_path, resume):
    # a dict of lambdas used to be keyed by repr(): '<function <lambda> at 0x7f...>', a new key in every process
    source = "def measure():\n    return sorted(VARIANTS)\n"
    first = utils.runs.part_key("tiny", "a", "smoke", SIZES, notebook_function(source, VARIANTS=lambdas_cell("model")))
    again = utils.runs.part_key("tiny", "a", "smoke", SIZES, notebook_function(source, VARIANTS=lambdas_cell("model")))
    other = utils.runs.part_key("tiny", "a", "smoke", SIZES, notebook_function(source, VARIANTS=lambdas_cell("None")))
    assert first == again, "the same lambda, defined anew (another address), changed the key"
    assert first != other, "another lambda body kept the key"
    assert " at 0x" not in utils.runs._value_text({"o": object()})


def test_a_module_run_in_another_process_joins_the_key_when_named(tmp_path, monkeypatch, resume):
    # chapter 7's server runs as `python -m utils.serve_app`: no function the part calls refers to its code
    (tmp_path / "server_mod.py").write_text("def serve():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import server_mod

    measure, calls = counted({"p50_ms": 2.0})
    plain = utils.runs.part_key("tiny", "a", "smoke", SIZES, measure)
    named = utils.runs.part_key("tiny", "a", "smoke", SIZES, measure, also=(server_mod,))
    assert plain != named and named == utils.runs.part_key("tiny", "a", "smoke", SIZES, measure, also=(server_mod,))
    new_run(tmp_path).part("a", measure, also=(server_mod,))
    new_run(tmp_path).part("a", measure, also=(server_mod,))
    assert calls == [1], "the same server code was measured again"
    (tmp_path / "server_mod.py").write_text("def serve():\n    return 2  # the server changed\n")
    new_run(tmp_path).part("a", measure, also=(server_mod,))
    assert calls == [1, 1], "a changed server kept its stored result"


STALE_KEY = "0123456789abcdef"  # as if keyed by an address no process can compute again


def restamp(tmp_path, name, key):
    """Give part `name` of chapter 'tiny' another stored key, its result kept."""
    path = utils.runs.parts_path("tiny", root=tmp_path)
    parts = json.loads(path.read_text())
    parts["parts"][name]["key"] = key
    path.write_text(json.dumps(parts))


def test_adopt_keeps_a_stored_result_under_the_current_key(tmp_path, resume, monkeypatch):
    measure, calls = counted([1, 2])
    new_run(tmp_path).part("a", measure)
    restamp(tmp_path, "a", STALE_KEY)
    monkeypatch.setenv("BOOK_ADOPT", json.dumps(["a", "b"]))
    run = new_run(tmp_path)
    assert run.part("a", measure) == [1, 2] and len(calls) == 1 and run.log[0]["how"] == "reused"
    entry = stored(tmp_path)["a"]
    assert entry["adopted_from"] == STALE_KEY and entry["key"] != STALE_KEY
    with pytest.raises(RuntimeError, match="'b' of tiny cannot be adopted: no result is stored"):
        new_run(tmp_path).part("b", measure)
    monkeypatch.delenv("BOOK_ADOPT")
    assert new_run(tmp_path).part("a", measure) == [1, 2] and len(calls) == 1, "the adopted key is reused as usual"


def test_without_adopt_a_part_under_another_key_is_measured_again(tmp_path, resume):
    measure, calls = counted([1])
    new_run(tmp_path).part("a", measure)
    restamp(tmp_path, "a", STALE_KEY)
    new_run(tmp_path).part("a", measure)
    assert len(calls) == 2 and "adopted_from" not in stored(tmp_path)["a"]


def test_run_book_adopt_needs_resume(capsys):
    with pytest.raises(SystemExit) as stop:
        utils.run_book.main(["--adopt", "a", "notebooks/01_mechanism.ipynb"])
    assert stop.value.code == 2 and "--adopt needs --resume" in capsys.readouterr().err
    assert "BOOK_ADOPT" not in os.environ


def test_other_preset_sizes_or_library_code_measure_again(tmp_path, resume, monkeypatch):
    measure, calls = counted([1])
    new_run(tmp_path).part("a", measure)
    new_run(tmp_path).part("a", measure)
    assert len(calls) == 1
    new_run(tmp_path, sizes={**SIZES, "n": 3}).part("a", measure)
    assert len(calls) == 2
    new_run(tmp_path, preset="workshop", sizes={**SIZES, "n": 3}).part("a", measure)
    assert len(calls) == 3
    monkeypatch.setattr(utils.runs, "measuring_code", lambda folder=None: "def time_fn(): changed")
    new_run(tmp_path, preset="workshop", sizes={**SIZES, "n": 3}).part("a", measure)
    assert len(calls) == 4


def keep_measuring_code(tmp_path, monkeypatch, change=True):
    """A folder holding the measuring code as it is now, and (with change) a library whose measuring code then changes."""
    old = tmp_path / "measuring-code-before"
    old.mkdir()
    for name in utils.runs.MEASURING_CODE:
        (old / name).write_text((utils.runs.Path(utils.runs.__file__).parent / name).read_text())
    before = utils.runs.measuring_code
    if change:
        monkeypatch.setattr(utils.runs, "measuring_code",
                            lambda folder=None: before(folder) if folder else before() + "\n# a helper removed")
    monkeypatch.setenv("BOOK_REKEY_FROM", str(old))


def test_rekey_stores_the_part_under_its_new_key_and_measures_nothing(tmp_path, resume, monkeypatch):
    measure, calls = counted([1, 2])
    new_run(tmp_path).part("a", measure)
    first_key = stored(tmp_path)["a"]["key"]
    keep_measuring_code(tmp_path, monkeypatch)
    run = new_run(tmp_path)
    assert run.part("a", measure) == [1, 2] and len(calls) == 1, "re-keyed, not measured"
    entry = stored(tmp_path)["a"]
    assert entry["rekeyed_from"] == first_key and entry["key"] != first_key and entry["result"] == [1, 2]
    assert run.log[0]["how"] == "reused"
    monkeypatch.delenv("BOOK_REKEY_FROM")
    assert new_run(tmp_path).part("a", measure) == [1, 2] and len(calls) == 1, "the new key is reused as usual"


def test_rekey_refuses_a_part_whose_own_code_changed_or_that_was_never_measured(tmp_path, resume, monkeypatch):
    measure, calls = counted([1])
    new_run(tmp_path).part("a", measure)
    keep_measuring_code(tmp_path, monkeypatch)
    other = notebook_function("def measure():\n    return [2]\n")  # other code under the same part name
    with pytest.raises(RuntimeError, match="'a' of tiny cannot be re-keyed: more than the measuring code changed"):
        new_run(tmp_path).part("a", other)
    with pytest.raises(RuntimeError, match="'b' of tiny cannot be re-keyed: nothing is stored"):
        new_run(tmp_path).part("b", measure)
    assert len(calls) == 1 and "rekeyed_from" not in stored(tmp_path)["a"]


MEASURE_SOURCE = "def measure():\n    seconds, out = utils.time_first_call(lambda: [1, 2])\n    return out\n"


def test_rekey_reads_the_functions_a_part_calls_from_the_old_measuring_files(tmp_path, resume, monkeypatch):
    """A part stored by an older library whose timing function it calls has since changed is re-keyed, not refused."""
    import shutil
    import subprocess
    import sys

    old_repo, kept = tmp_path / "old", tmp_path / "rekey-old"
    shutil.copytree(REPO / "utils", old_repo / "utils", ignore=shutil.ignore_patterns("__pycache__"))
    timing = old_repo / "utils" / "timing.py"
    doc = '    """Seconds taken by one call of fn(), GPU work included: for a compiled fn, its compile time (chapter 1)."""\n'
    assert doc in timing.read_text()
    timing.write_text(timing.read_text().replace(doc, doc + "    # as it was\n"))  # the old time_first_call
    kept.mkdir()
    for name in utils.runs.MEASURING_CODE:
        shutil.copy(old_repo / "utils" / name, kept / name)
    script = old_repo / "measure_then.py"  # the part measured by the old library, in a process of its own
    script.write_text(f"import sys\nsys.path.insert(0, {str(old_repo)!r})\nimport utils\nfrom utils.runs import Run\n\n\n"
                      f"{MEASURE_SOURCE}\n\nprint(Run('tiny', 'smoke', {SIZES!r}, root={str(tmp_path)!r}).part('a', measure))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=old_repo)
    assert done.returncode == 0 and done.stdout.strip() == "[1, 2]", done.stderr[-2000:]
    stored_key = stored(tmp_path)["a"]["key"]

    measure = notebook_function(MEASURE_SOURCE, utils=utils)  # the same cell, with today's library
    assert utils.runs.part_key("tiny", "a", "smoke", SIZES, measure) != stored_key, "today's key differs"
    monkeypatch.setenv("BOOK_REKEY_FROM", str(kept))
    run = new_run(tmp_path)
    assert run.part("a", measure) == [1, 2] and run.log[0]["how"] == "reused"
    assert stored(tmp_path)["a"]["rekeyed_from"] == stored_key


def test_run_book_rekey_needs_resume_and_the_old_measuring_code(tmp_path, capsys):
    for argv in (["--rekey-from", str(tmp_path)], ["--resume", "--rekey-from", str(tmp_path)]):
        with pytest.raises(SystemExit) as stop:
            utils.run_book.main(argv + ["notebooks/01_mechanism.ipynb"])
        assert stop.value.code == 2
        assert "--rekey-from needs --resume and a folder with the old compare.py" in capsys.readouterr().err
    assert "BOOK_REKEY_FROM" not in os.environ


def test_each_part_is_stored_apart(tmp_path, resume):
    run = new_run(tmp_path)
    run.part("a", lambda: 1)
    run.part("b", lambda: 2)
    assert {name: e["result"] for name, e in stored(tmp_path).items()} == {"a": 1, "b": 2}


def test_a_part_whose_measure_raises_is_not_stored(tmp_path, resume):
    def broken():
        raise RuntimeError("compile failed")

    run = new_run(tmp_path)
    with pytest.raises(RuntimeError, match="compile failed"):
        run.part("a", broken)
    assert "result" not in stored(tmp_path).get("a", {})
    assert run.log == []  # not reported as measured
    measure, calls = counted(5)
    assert new_run(tmp_path).part("a", measure) == 5 and calls == [1]


# --- the deadline ----------------------------------------------------------------------------------

def store_entry(tmp_path, name, entry):
    path = utils.runs.parts_path("tiny", root=tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"chapter": "tiny", "gpu": "cpu", "parts": {name: entry}}))


def test_a_part_that_does_not_fit_before_the_deadline_is_not_started(tmp_path, resume, monkeypatch):
    # its last measurement (older code: another key) took 200 s; 50 s are left
    store_entry(tmp_path, "slow", {"key": "older code", "seconds": 200.0, "result": [0]})
    monkeypatch.setenv("BOOK_DEADLINE", str(time.time() + 50))
    measure, calls = counted([1])
    with pytest.raises(PartsPending, match=r"'slow' of tiny needs about 200 s and \d+ s are left"):
        new_run(tmp_path).part("slow", measure)
    assert calls == []
    assert stored(tmp_path)["slow"] == {"key": "older code", "seconds": 200.0, "result": [0]}  # left as it was

    monkeypatch.setenv("BOOK_DEADLINE", str(time.time() + 300))  # a command with room for it
    assert new_run(tmp_path).part("slow", measure) == [1] and calls == [1]


def test_the_deadline_does_not_stop_reused_parts(tmp_path, resume, monkeypatch):
    measure, calls = counted([1])
    new_run(tmp_path).part("a", measure)
    monkeypatch.setenv("BOOK_DEADLINE", str(time.time() - 1))  # already past
    run = new_run(tmp_path)
    assert run.part("a", measure) == [1] and run.log[-1]["how"] == "reused"
    store_entry(tmp_path, "b", {"key": "older", "seconds": 0.5})
    with pytest.raises(PartsPending):  # but a part to measure, even briefly, is not started
        run.part("b", measure)
    assert calls == [1]


def store_elsewhere(tmp_path, gpu, name, seconds, result=(0,)):
    """A part of chapter 'tiny' stored under another GPU's folder, `seconds` long (with a result unless None)."""
    path = tmp_path / gpu / "parts" / "tiny.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"key": f"{gpu}'s key", "seconds": seconds, **({"result": list(result)} if result is not None else {})}
    path.write_text(json.dumps({"chapter": "tiny", "gpu": gpu, "parts": {name: entry}}))


def test_a_part_new_to_this_gpu_waits_when_another_gpu_took_too_long_for_what_is_left(tmp_path, resume, monkeypatch):
    store_elsewhere(tmp_path, "h100-80gb-hbm3", "slow", 100.0)  # 1.5x: 150 s expected here
    monkeypatch.setenv("BOOK_DEADLINE", str(time.time() + 120))
    measure, calls = counted([1])
    run = new_run(tmp_path)
    run.part("quick", lambda: [0])  # something measured first in this command
    with pytest.raises(PartsPending, match=r"'slow' of tiny is new on this GPU and took up to 100 s on another"):
        run.part("slow", measure)
    assert calls == [] and "slow" not in stored(tmp_path)

    monkeypatch.setenv("BOOK_DEADLINE", str(time.time() + 200))  # room for 1.5x
    assert new_run(tmp_path).part("slow", measure) == [1] and calls == [1]


def test_a_new_part_first_in_its_command_starts_whatever_another_gpu_took(tmp_path, resume, monkeypatch):
    store_elsewhere(tmp_path, "h100-80gb-hbm3", "slow", 1000.0)
    monkeypatch.setenv("BOOK_DEADLINE", str(time.time() + 120))
    measure, calls = counted([1])
    assert new_run(tmp_path).part("slow", measure) == [1] and calls == [1]  # it has the whole command


@pytest.mark.parametrize("gpu, seconds, result", [("t4-simulated-on-h200", 1000.0, (0,)),  # other sizes, 2 threads
                                                  ("h200", 1000.0, None)])  # cut off there, never finished
def test_only_finished_parts_of_real_gpus_estimate_a_new_one(tmp_path, resume, monkeypatch, gpu, seconds, result):
    store_elsewhere(tmp_path, gpu, "slow", seconds, result)
    monkeypatch.setenv("BOOK_DEADLINE", str(time.time() + 120))
    run, (measure, calls) = new_run(tmp_path), counted([1])
    run.part("quick", lambda: [0])
    assert run.part("slow", measure) == [1] and calls == [1]


class Killed(BaseException):
    """Stands for the runner killing the kernel mid-part (nothing after the measure runs)."""


def test_a_part_cut_off_midway_gets_the_first_turn_of_the_next_command(tmp_path, resume, monkeypatch):
    killed, calls = [True], []

    def measure():  # the same code in every command: only the first is cut off
        calls.append(1)
        if killed[0]:
            raise Killed()
        return [1]

    monkeypatch.setenv("BOOK_DEADLINE", str(time.time() + 100))
    with pytest.raises(Killed):
        new_run(tmp_path).part("long", measure)
    entry = stored(tmp_path)["long"]
    assert "attempt_started" in entry and "result" not in entry  # the attempt is recorded, no result

    killed[0] = False
    later = new_run(tmp_path)
    later.part("short", lambda: [0])  # another part measured first in this command
    with pytest.raises(PartsPending, match="cut off by the end of a command before"):
        later.part("long", measure)
    assert len(calls) == 1
    assert new_run(tmp_path).part("long", measure) == [1] and len(calls) == 2  # first in a command of its own
    assert "attempt_started" not in stored(tmp_path)["long"]


def test_a_part_cut_off_twice_with_a_command_to_itself_is_a_clear_error(tmp_path, resume, monkeypatch):
    calls = []

    def measure():  # never finishes: every command ends inside it
        calls.append(1)
        raise Killed()

    monkeypatch.setenv("BOOK_DEADLINE", str(time.time() + 100))
    first = new_run(tmp_path)
    first.part("short", lambda: [0])  # measured before it: this cut-off does not count
    with pytest.raises(Killed):
        first.part("long", measure)
    for _ in range(2):  # then twice as the first part measured in its command
        with pytest.raises(Killed):
            new_run(tmp_path).part("long", measure)
    assert stored(tmp_path)["long"]["cut_off_alone"] == 1
    with pytest.raises(utils.runs.PartTooLong, match="cut off 2 times .* does not finish within one command"):
        new_run(tmp_path).part("long", measure)
    assert len(calls) == 3 and "result" not in stored(tmp_path)["long"]


def test_a_part_that_fails_leaves_what_was_stored_before_and_no_cut_off(tmp_path, resume, monkeypatch):
    def broken():
        raise ValueError("numpy has no bfloat16")

    monkeypatch.setenv("BOOK_DEADLINE", str(time.time() + 100))
    with pytest.raises(ValueError, match="bfloat16"):
        new_run(tmp_path).part("new part", broken)
    assert "new part" not in stored(tmp_path)  # nothing was stored for it: no attempt marker either
    new_run(tmp_path).part("old part", lambda: [1])
    before = stored(tmp_path)["old part"]
    with pytest.raises(ValueError):
        new_run(tmp_path).part("old part", broken)  # its code changed, and the new code fails
    assert stored(tmp_path)["old part"] == before
    later = new_run(tmp_path)
    later.part("short", lambda: [0])  # measured first: a cut-off part would now wait for the next command
    assert later.part("new part", lambda: [2]) == [2]  # a failed part is not taken for one cut off


# --- what a part may return ----------------------------------------------------------------------

def test_a_result_that_is_not_json_is_a_clear_type_error(tmp_path, resume):
    import torch

    with pytest.raises(TypeError, match="part 'tensor' returned something that is not JSON data"):
        new_run(tmp_path).part("tensor", lambda: {"ms": torch.tensor(1.0)})
    with pytest.raises(TypeError, match="part 'object' returned something that is not JSON data"):
        new_run(tmp_path).part("object", lambda: [object()])
    assert "result" not in stored(tmp_path).get("tensor", {})


def test_a_measured_result_looks_as_a_reused_one(tmp_path, resume):
    measure = lambda: {"rows": ({"ms": 1.0},), "n": 2}  # noqa: E731 (a tuple comes back from JSON as a list)
    measured = new_run(tmp_path).part("a", measure)
    reused = new_run(tmp_path).part("a", measure)
    assert measured == reused == {"rows": [{"ms": 1.0}], "n": 2}


def test_nan_and_infinity_are_stored_as_null(tmp_path, resume):
    result = {"loss": float("nan"), "hi": float("inf"), "lo": float("-inf"), "ms": [1.5, float("nan")]}
    expected = {"loss": None, "hi": None, "lo": None, "ms": [1.5, None]}
    assert new_run(tmp_path).part("a", lambda: result) == expected
    assert stored(tmp_path)["a"]["result"] == expected


def test_text_that_mentions_nan_is_kept_as_it_is(tmp_path, resume):
    result = {"loss": float("nan"), "reason": "loss became NaN after Infinity steps"}
    expected = {"loss": None, "reason": "loss became NaN after Infinity steps"}
    assert new_run(tmp_path).part("a", lambda: result) == expected


# --- saving and the About box --------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["full", "colab", "workshop", "smoke"])
def test_save_writes_results_only_in_the_full_preset(tmp_path, resume, monkeypatch, preset):
    root = tmp_path / "results-root"  # the Run's root: its parts and its results file both go there
    run = new_run(root, preset=preset)
    run.part("a", lambda: 1)
    saved = run.save([{"workload": "w", "variant": "eager", "median_ms": 1.0, "status": "ok"}], diffusers="0.1")
    written = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.json") if "parts" not in p.parts)
    if preset != "full":
        assert saved is None and written == []
        return
    assert written == [f"{utils.gpu_slug()}/tiny.json"] and saved == root / utils.gpu_slug() / "tiny.json"
    data = utils.load_results(saved)
    assert data["provenance"]["preset"] == "full" and data["provenance"]["diffusers"] == "0.1"
    assert [p["part"] for p in data["provenance"]["parts"]] == ["a"]
    assert data["measurements"][0]["median_ms"] == 1.0


def test_about_box_names_each_part_and_how_it_was_made(tmp_path, resume, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    def one():
        return 1

    new_run(tmp_path).part("modes, batch <8>", one)
    run = new_run(tmp_path)
    run.part("modes, batch <8>", one)
    run.part("compile, cold and warm", lambda: 2)
    run.about(why="no CUDA GPU & no sizes", transformers="4.0")
    assert len(shown) == 1
    page = shown[0].data
    assert page.startswith('<details class="about-run"><summary>About this run</summary>')
    assert page.rstrip().endswith("</details>")
    assert "<td>modes, batch &lt;8&gt;</td><td>reused</td>" in page  # escaped, and how it was made
    assert "<td>compile, cold and warm</td><td>measured</td>" in page
    assert "2 measured parts; 1 reused" in page
    assert "no CUDA GPU &amp; no sizes" in page and "<th>transformers</th><td>4.0</td>" in page
    assert "<th>preset</th><td>smoke</td>" in page and "abc1234" in page


# --- run_book end to end, on a tiny generated notebook ---------------------------------------------

TINY_SETUP = """\
import sys
sys.path.insert(0, {repo!r})
from pathlib import Path
import utils
FLAGS = Path({flags!r})
PRESET_NAME, P, WHY = utils.pick_preset(PRESET, {{"smoke": {{"n": 2}}, "full": {{"n": 3}}}})
run = utils.Run("tiny", PRESET_NAME, P, root={root!r})
print(f"preset {{PRESET_NAME}} ({{WHY}})")
"""
TINY_FIRST = """\
def first():
    with open(FLAGS / "first.calls", "a") as calls:  # the test counts the measurements
        calls.write("x")
    if (FLAGS / "fail").exists():
        raise RuntimeError("the test asked this part to fail")
    return {"n": P["n"], "ms": [1.5, 2.5]}

a = run.part("first", first)
"""
TINY_SECOND = """\
def second():
    if (FLAGS / "pending").exists():
        raise utils.PartsPending("part 'second' does not fit in this command (the test says so)")
    return [{"variant": "eager", "ms": 1.0}]

b = run.part("second", second)
print("parts:", ", ".join(f"{p['part']} {p['how']}" for p in run.log))
run.about(why=WHY)
"""


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A chapter notebook in miniature under tmp_path, its executed copies going to tmp_path/executed."""
    import nbformat

    flags, root = tmp_path / "flags", tmp_path / "results"
    flags.mkdir()
    params = nbformat.v4.new_code_cell('PRESET = "auto"')
    params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Tiny"), params,
                nbformat.v4.new_code_cell(TINY_SETUP.format(repo=str(REPO), flags=str(flags), root=str(root))),
                nbformat.v4.new_code_cell(TINY_FIRST), nbformat.v4.new_code_cell(TINY_SECOND)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    chapter = tmp_path / "chapter" / "09_tiny.ipynb"
    chapter.parent.mkdir()
    nbformat.write(nb, chapter)
    monkeypatch.setattr(utils.run_book, "DEFAULT_OUT", tmp_path / "executed")
    # main()'s help text writes DEFAULT_OUT relative to REPO_ROOT, which fails for a folder outside the
    # checkout (test_run_book_accepts_an_out_folder_outside_the_checkout): keep the two consistent here
    monkeypatch.setattr(utils.run_book, "REPO_ROOT", tmp_path)
    for name in ("BOOK_RESUME", "BOOK_DEADLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BOOK_COMMIT", "abc1234")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return {"path": chapter, "bytes": chapter.read_bytes(), "flags": flags, "root": root,
            "out": tmp_path / "executed", "parts": utils.runs.parts_path("tiny", root=root)}


def outputs_text(nb):
    texts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                texts.append(out["text"])
            else:
                texts.extend(str(v) for v in out.get("data", {}).values())
    return "".join("".join(t) if isinstance(t, list) else t for t in texts)


def check_rendered(path, preset):
    """A rendered copy: no injected cell, PRESET = "auto" kept, the preset reached the kernel, no error."""
    nb = json.loads(path.read_text())
    tags = [c.get("metadata", {}).get("tags", []) for c in nb["cells"]]
    assert not [t for t in tags if "injected-parameters" in t], "papermill's injected cell was kept"
    kept = set(nb["metadata"].get("papermill", {})) & {"input_path", "output_path"}
    assert not kept, f"papermill's record of the runner's paths was kept: {kept}"
    params = [c for c, t in zip(nb["cells"], tags) if "parameters" in t]
    assert len(params) == 1 and "".join(params[0]["source"]) == 'PRESET = "auto"'
    assert not [o for c in nb["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    text = outputs_text(nb)
    assert f"preset {preset} (chosen by hand)" in text
    assert '<details class="about-run">' in text
    return text


def test_run_book_refuses_an_unknown_preset_before_any_kernel_starts(tiny, monkeypatch, capsys):
    def no_run(*args, **kwargs):
        raise AssertionError("a chapter was run")

    execute = utils.run_book.execute
    monkeypatch.setattr(utils.run_book, "execute", no_run)
    monkeypatch.setattr(utils.run_book.subprocess, "Popen", no_run)
    with pytest.raises(SystemExit) as stop:
        utils.run_book.main(["--preset", "bogus", str(tiny["path"])])
    assert stop.value.code == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err
    assert tiny["path"].read_bytes() == tiny["bytes"]
    assert not (tiny["flags"] / "first.calls").exists() and not tiny["out"].exists()
    with pytest.raises(ValueError, match="Unknown preset 'bogus'"):  # the function refuses it too
        execute(tiny["path"], preset="bogus")


def test_run_book_accepts_an_out_folder_outside_the_checkout(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(utils.run_book, "DEFAULT_OUT", tmp_path / "executed")
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help at the terminal's width
    with pytest.raises(SystemExit) as stop:
        utils.run_book.main(["--help"])
    assert stop.value.code == 0 and str(tmp_path / "executed") in capsys.readouterr().out


def test_run_book_smoke_run_writes_a_copy_and_leaves_the_chapter(tiny, capsys):
    kept = earlier_results(tiny)
    assert utils.run_book.main(["--preset", "smoke", str(tiny["path"])]) == 0
    assert all(path.exists() for path in kept), "a run that leaves the chapter must leave its results of record"
    assert tiny["path"].read_bytes() == tiny["bytes"], "a smoke run changed the committed chapter"
    copy = tiny["out"] / tiny["path"].name
    text = check_rendered(copy, "smoke")
    assert "parts: first measured, second measured" in text
    assert f"written to {copy}" in capsys.readouterr().out
    assert not tiny["parts"].exists()  # without --resume nothing is stored


def test_run_book_failed_run_leaves_the_chapter_and_returns_1(tiny, capsys):
    (tiny["flags"] / "fail").touch()
    assert utils.run_book.main(["--preset", "smoke", str(tiny["path"])]) == 1
    assert tiny["path"].read_bytes() == tiny["bytes"]
    out = capsys.readouterr().out
    assert "FAILED" in out and "RuntimeError: the test asked this part to fail" in out
    assert not (tiny["out"] / tiny["path"].name).exists()  # no copy that looks like a finished run
    assert list((tiny["out"] / "work").glob("*.failed.ipynb"))  # the failed run kept to be read


def earlier_results(tiny):
    """Results files of chapter 09_tiny from another GPU, a simulated small one and this machine (cpu)."""
    paths = [tiny["root"] / gpu / "09_tiny.json" for gpu in ("h100-80gb-hbm3", "t4-simulated-on-h200", "cpu")]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    return paths


def test_run_book_full_run_writes_in_place_without_the_injected_cell(tiny, monkeypatch, capsys):
    other_gpu, simulated, here = earlier_results(tiny)
    assert utils.run_book.main(["--preset", "full", str(tiny["path"])]) == 0
    assert not other_gpu.exists(), "the page now shows this GPU's run: the other GPU's results must go"
    assert simulated.exists() and here.exists()
    assert f"removed {other_gpu}, an earlier GPU's run" in capsys.readouterr().out
    assert tiny["path"].read_bytes() != tiny["bytes"]
    text = check_rendered(tiny["path"], "full")
    assert "parts: first measured, second measured" in text
    assert not (tiny["out"] / tiny["path"].name).exists()


def test_run_book_simulating_a_small_gpu_never_writes_in_place(tiny, monkeypatch):
    monkeypatch.setenv(utils.env.SIMULATE_ENV, "")  # what main() sets for the kernel is undone after the test
    assert utils.run_book.main(["--preset", "full", "--simulate", "t4", str(tiny["path"])]) == 0
    assert os.environ[utils.env.SIMULATE_ENV] == "t4"
    assert tiny["path"].read_bytes() == tiny["bytes"], "a simulated run replaced the committed chapter"
    assert (tiny["out"] / tiny["path"].name).exists()
    # its record (tests/test_workshop.py has the rest): no GPU here, so it goes to the git-ignored results/cpu/
    [entry] = json.loads(utils.run_book.runs_path("cpu").read_text())["runs"]
    assert (entry["chapter"], entry["asked"], entry["preset"], entry["outcome"]) == ("09_tiny", "full", "full", "done")


def test_run_book_resumes_a_chapter_over_two_commands(tiny, capsys):
    (tiny["flags"] / "pending").touch()  # the second part does not fit in the first command
    command = ["--preset", "smoke", "--resume", "--max-seconds", "600", str(tiny["path"])]
    assert utils.run_book.main(command) == utils.run_book.EXIT_PENDING == 3
    assert "parts stored, more to measure" in capsys.readouterr().out
    parts = json.loads(tiny["parts"].read_text())["parts"]
    assert parts["first"]["result"] == {"n": 2, "ms": [1.5, 2.5]}
    assert "result" not in parts.get("second", {})
    assert tiny["path"].read_bytes() == tiny["bytes"] and not (tiny["out"] / tiny["path"].name).exists()

    (tiny["flags"] / "pending").unlink()
    assert utils.run_book.main(command) == 0  # the same command again finishes the chapter
    assert (tiny["flags"] / "first.calls").read_text() == "x", "the stored first part was measured again"
    text = check_rendered(tiny["out"] / tiny["path"].name, "smoke")
    assert "parts: first reused, second measured" in text
    assert "<td>first</td><td>reused</td>" in text and "<td>second</td><td>measured</td>" in text
    assert tiny["path"].read_bytes() == tiny["bytes"]
    assert json.loads(tiny["parts"].read_text())["parts"]["second"]["result"] == [{"variant": "eager", "ms": 1.0}]


def test_run_book_resume_stops_at_a_real_deadline(tiny, capsys):
    """A part whose last measurement took longer than the command has left is not started."""
    tiny["parts"].parent.mkdir(parents=True)
    tiny["parts"].write_text(json.dumps({"chapter": "tiny", "gpu": "cpu", "parts": {
        "second": {"key": "an older version of its code", "seconds": 200.0, "result": []}}}))
    short = ["--preset", "smoke", "--resume", "--max-seconds", "100", str(tiny["path"])]
    assert utils.run_book.main(short) == 3
    assert "'second' of tiny needs about 200 s" in capsys.readouterr().out
    assert "result" in json.loads(tiny["parts"].read_text())["parts"]["first"]
    longer = ["--preset", "smoke", "--resume", "--max-seconds", "500", str(tiny["path"])]
    assert utils.run_book.main(longer) == 0
    assert "parts: first reused, second measured" in check_rendered(tiny["out"] / tiny["path"].name, "smoke")


def test_the_smoke_runs_ci_starts_first_exist_and_go_longest_first():
    from conftest import SMOKE_SECONDS, expected_seconds

    for key in SMOKE_SECONDS:  # a renamed notebook or test would quietly lose its place
        path = REPO / "notebooks" / f"{key[1:-1]}.ipynb" if key.startswith("[") else REPO / "tests" / key.split("::")[0]
        assert path.exists(), key
    ids = ["tests/test_utils.py::test_x", "tests/test_notebooks.py::test_runs_in_smoke_preset_on_cpu[01_mechanism]",
           "tests/test_notebooks.py::test_runs_in_smoke_preset_on_cpu[05_diffusion]",
           "tests/test_deployment.py::test_draft_runs_in_smoke_preset_on_cpu"]
    assert sorted(ids, key=lambda n: -expected_seconds(n)) == [ids[3], ids[2], ids[1], ids[0]]
