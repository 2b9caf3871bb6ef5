"""Unit tests of utils/: each would fail if the helper it checks were wrong."""
import inspect
import json
import math
import time
import types

import pytest
import torch
from torch import nn
from torch.utils.benchmark import Timer

import utils
from utils import compare as cmp
from utils.results import load_results, save_results

TINY = dict(n_layers=1, d_model=32, n_heads=4)


def make_tiny():
    return utils.block_stack(**TINY, device="cpu", dtype=torch.float32)


def tiny_inputs(batch=2, seq=8):
    return (torch.randn(batch, seq, TINY["d_model"], generator=torch.Generator().manual_seed(0)),)


class WithGraphBreak(nn.Module):
    """A model whose forward breaks the graph (a Python branch on a tensor's value)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            y = y * 2
        return torch.relu(y)


# --- env ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, slug", [("NVIDIA H200", "h200"), ("Tesla T4", "t4"),
                                        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
                                        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"), ("cpu", "cpu"),
                                        ("Tesla T4 (simulated on NVIDIA H200)", "t4-simulated-on-h200")])
def test_gpu_slug(name, slug):
    assert utils.gpu_slug(name) == slug


def fake_gpu(name, gb):
    """What torch.cuda.get_device_properties(0) reports, for the fields choose_preset reads."""
    return types.SimpleNamespace(name=name, total_memory=int(gb * 1e9))


@pytest.mark.parametrize("name, gb, preset", [
    ("NVIDIA H200", 150.0, "full"), ("NVIDIA A100-SXM4-80GB", 85.1, "full"),
    ("NVIDIA H100 80GB HBM3", 79.6, "full"),  # an 80 GB card reports a little less than 80e9 bytes usable
    ("Tesla T4", 15.8, "colab"), ("NVIDIA L4", 23.7, "colab"), ("NVIDIA A10G", 23.9, "colab"),
    ("NVIDIA A100-SXM4-40GB", 42.4, "workshop"), ("NVIDIA L40S", 48.3, "workshop"),
    ("NVIDIA GeForce RTX 3070", 8.4, "workshop")])
def test_choose_preset_by_gpu_memory(name, gb, preset):
    chosen, why = utils.choose_preset(fake_gpu(name, gb))
    assert chosen == preset
    assert name in why and f"{gb:.0f} GB" in why  # it says which GPU it found and why


def test_choose_preset_without_a_gpu_is_smoke(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    chosen, why = utils.choose_preset()
    assert chosen == "smoke" and "no CUDA GPU" in why


@pytest.fixture
def fake_h200(monkeypatch):
    """A CPU machine that reports an H200, recording the memory cap asked of it; compile_threads restored after."""
    import torch._inductor.config as inductor_config

    caps, threads = [], inductor_config.compile_threads
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: fake_gpu("NVIDIA H200", 150.0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device=None: caps.append(f))
    monkeypatch.setattr(torch.cuda, "mem_get_info", torch.cuda.mem_get_info)  # a simulation wraps it: undone after
    yield caps
    inductor_config.compile_threads = threads  # not monkeypatch: undoing it would delete the config entry


def test_a_simulated_t4_on_an_h200_gets_the_colab_preset_fp16_and_two_compile_threads(monkeypatch, fake_h200):
    import torch._inductor.config as inductor_config

    caps = fake_h200
    assert utils.choose_preset()[0] == "full" and not caps
    monkeypatch.setenv(utils.env.SIMULATE_ENV, "t4")
    chosen, why = utils.choose_preset()
    assert chosen == "colab" and "Tesla T4 (simulated on NVIDIA H200)" in why
    assert caps == [pytest.approx(0.1)], "memory is capped to the T4's 15 GB of the H200's 150"
    assert inductor_config.compile_threads == 2
    assert utils.pick_dtype("cuda") == torch.float16, "a T4 has no fast bf16"
    assert utils.gpu_name() == "Tesla T4 (simulated on NVIDIA H200)"
    assert utils.gpu_slug() != "h200", "a simulated run must not store its parts with the H200's"
    assert utils.provenance()["capability"] == "7.5"


def test_an_unknown_simulated_gpu_is_a_clear_error(monkeypatch, fake_h200):
    monkeypatch.setenv(utils.env.SIMULATE_ENV, "v100")
    with pytest.raises(ValueError, match="BOOK_SIMULATE_GPU='v100': choose one of t4"):
        utils.choose_preset()


def test_pick_preset_falls_back_to_a_smaller_preset_and_says_so():
    presets = {"smoke": {"n": 1}, "workshop": {"n": 2}, "full": {"n": 3}}
    assert utils.pick_preset("auto", presets, props=fake_gpu("NVIDIA H200", 150))[:2] == ("full", {"n": 3})
    name, sizes, why = utils.pick_preset("auto", presets, props=fake_gpu("Tesla T4", 15.8))
    assert (name, sizes) == ("workshop", {"n": 2})  # this chapter has no colab preset
    assert "no 'colab' preset" in why and "'workshop'" in why
    assert utils.pick_preset("full", presets, props=fake_gpu("Tesla T4", 15.8)) == ("full", {"n": 3}, "chosen by hand")
    assert utils.pick_preset("auto", {"smoke": {"n": 1}}, props=fake_gpu("NVIDIA H200", 150))[:2] == ("smoke", {"n": 1})


def test_resolve_preset_auto_follows_the_hardware_found(monkeypatch):
    presets = {"smoke": {"n": 1}, "full": {"n": 2}}
    assert utils.resolve_preset("auto", presets, device="cpu") == ("smoke", {"n": 1})
    assert utils.resolve_preset("full", presets, device="cpu") == ("full", {"n": 2})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: fake_gpu("NVIDIA H200", 150))
    assert utils.resolve_preset("auto", presets, device="cuda") == ("full", {"n": 2})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: fake_gpu("NVIDIA GeForce RTX 3070", 8.4))
    assert utils.resolve_preset("auto", presets, device="cuda") == ("smoke", {"n": 1})  # no workshop preset here


def test_unknown_preset_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown preset 'huge'.*auto, smoke, full"):
        utils.resolve_preset("huge", {"smoke": {}, "full": {}}, device="cpu")


def test_dtype_on_cpu_is_fp32(monkeypatch):
    monkeypatch.delenv("BOOK_DTYPE", raising=False)
    assert utils.pick_dtype("cpu") is torch.float32


def test_book_dtype_gives_a_cpu_a_gpus_dtype_and_refuses_a_bad_name(monkeypatch):
    monkeypatch.setenv("BOOK_DTYPE", "bfloat16")
    assert utils.pick_dtype("cpu") is torch.bfloat16
    for bad in ("bf16", "int8", "Tensor"):
        monkeypatch.setenv("BOOK_DTYPE", bad)
        with pytest.raises(ValueError, match=f"BOOK_DTYPE='{bad}' is not a floating-point torch dtype"):
            utils.pick_dtype("cpu")


def test_provenance_names_versions_and_preset(monkeypatch):
    monkeypatch.setenv("BOOK_COMMIT", "abc1234")
    prov = utils.provenance("smoke")
    assert prov["torch"] == torch.__version__
    assert prov["preset"] == "smoke" and prov["commit"] == "abc1234"
    assert prov["gpu"] == utils.gpu_name()
    assert len(prov["date"]) == 10


# --- timing ------------------------------------------------------------------------------------

def test_time_fn_agrees_with_torch_benchmark(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # one core: less exposed to other load
    a = torch.randn(256, 256)
    reference = Timer("a @ a", globals={"a": a}, num_threads=1)
    # alternate the two, three times each, and compare the quietest of each, so that load from
    # other processes on a small machine hits both alike
    reference_ms, ours_ms = [], []
    for _ in range(3):
        reference_ms.append(reference.blocked_autorange(min_run_time=0.2).median * 1e3)
        ours = utils.time_fn(lambda: a @ a, min_run_time=0.2)
        ours_ms.append(ours.median_ms)
        assert ours.p10_ms <= ours.median_ms <= ours.p90_ms
    assert 0.5 < min(ours_ms) / min(reference_ms) < 2.0


def test_time_fn_measures_a_known_duration():
    timing = utils.time_fn(lambda: time.sleep(0.002), min_run_time=0.3)
    assert 2.0 <= timing.median_ms < 4.0
    assert timing.runs >= 20


def test_time_fn_spends_few_calls_on_a_slow_function():
    calls = []
    timing = utils.time_fn(lambda: (calls.append(1), time.sleep(0.05)), min_run_time=0.1, warmup=1)
    assert 50 <= timing.median_ms < 100
    assert timing.runs == 5  # min_blocks blocks of one call, not 20
    assert len(calls) <= 1 + 3 + 5 * 3  # warm-up, probe, and blocks with Timer's untimed calls


def test_time_first_call_returns_seconds_and_output():
    seconds, out = utils.time_first_call(lambda: (time.sleep(0.05), 7)[1])
    assert out == 7 and 0.05 <= seconds < 0.5


def test_break_even_calls():
    assert utils.break_even_calls(10.0, eager_ms=3.0, compiled_ms=1.0) == pytest.approx(5000)
    assert utils.break_even_calls(10.0, eager_ms=1.0, compiled_ms=1.5) is None


# --- comparison runner -------------------------------------------------------------------------

def test_variant_names_and_compile_kwargs():
    assert utils.variant_name(utils.EAGER) == "eager"
    assert utils.variant_name({"mode": "max-autotune", "fullgraph": True}) == "max-autotune+fullgraph"
    assert utils.variant_name({"backend": "aot_eager"}) == "backend=aot_eager"
    assert utils.variant_name({"mode": "default", "dynamic": False}) == "default+dynamic=False"
    assert utils.compile_kwargs({"mode": "default", "fullgraph": True}) == {"fullgraph": True}
    assert utils.compile_kwargs({"mode": "reduce-overhead"}) == {"mode": "reduce-overhead"}
    assert utils.compile_kwargs({"backend": "eager", "mode": "max-autotune"}) == {"backend": "eager"}


def test_compare_reports_every_configuration_and_goes_on_after_failures():
    configs = [{"mode": "default"}, {"mode": "reduce-overhead"}, {"backend": "no_such_backend"},
               {"backend": "aot_eager"}]
    rows = utils.compare(make_tiny, tiny_inputs(), configs, workload="tiny", device="cpu",
                         min_run_time=0.05, extra={"batch": 2})
    by_variant = {r["variant"]: r for r in rows}
    assert list(by_variant) == ["eager", "default", "reduce-overhead", "backend=no_such_backend",
                                "backend=aot_eager"]
    eager, default = by_variant["eager"], by_variant["default"]
    assert eager["status"] == "ok" and eager["speedup"] == 1.0 and eager["compile_s"] == 0.0
    assert default["status"] == "ok" and default["compile_s"] > 0 and default["batch"] == 2
    assert default["max_abs_err"] < utils.tolerance(torch.float32)
    # the speedup is the median of per-round ratios, with their spread, and eager timed in the same rounds
    assert 0 < default["speedup_lo"] <= default["speedup"] <= default["speedup_hi"]
    assert default["rounds"] == 7 and default["eager_ms"] > 0
    assert default["graph_breaks"] == 0 and default["recompiles"] == 0
    assert "reason" not in eager and "reason" not in default
    skipped, failed = by_variant["reduce-overhead"], by_variant["backend=no_such_backend"]
    assert skipped["status"] == "skipped"
    assert skipped["reason"].startswith("mode 'reduce-overhead' uses CUDA graphs")
    assert utils.describe(skipped).startswith("skipped: mode 'reduce-overhead' uses CUDA graphs")
    assert failed["status"] == "failed" and "no_such_backend" in failed["reason"]
    assert "median_ms" not in skipped and "median_ms" not in failed
    assert by_variant["backend=aot_eager"]["status"] == "ok"  # the sweep went on


def test_compare_counts_graph_breaks_and_fullgraph_fails():
    inputs = (torch.randn(4, 8),)
    rows = utils.compare(WithGraphBreak, inputs, [{"mode": "default"}, {"mode": "default", "fullgraph": True}],
                         workload="breaks", device="cpu", min_run_time=0.05)
    default, fullgraph = rows[1], rows[2]
    assert default["status"] == "ok" and default["graph_breaks"] >= 1
    assert fullgraph["status"] == "failed" and fullgraph["reason"]


def test_compare_counts_recompiles():
    def two_shapes(model, inputs):
        with torch.no_grad():
            model(inputs[0])
            return model(inputs[0][:1])  # a second batch size

    rows = utils.compare(make_tiny, tiny_inputs(), [{"mode": "default", "dynamic": False}],
                         workload="shapes", device="cpu", run=two_shapes, min_run_time=0.05)
    assert rows[1]["status"] == "ok" and rows[1]["recompiles"] == 1


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_compare_stops_a_compile_at_its_time_limit_and_skips_the_rest():
    import signal

    start = time.perf_counter()
    with torch._inductor.config.patch(force_disable_caches=True):  # a cold compile: seconds on a CPU, not one
        rows = utils.compare(make_tiny, tiny_inputs(), [{"mode": "default"}, {"backend": "aot_eager"}],
                             workload="limited", device="cpu", min_run_time=0.01, time_limit_s=1.0)
    assert time.perf_counter() - start < 15  # stopped, not compiled to the end
    eager, default, aot = rows
    assert eager["status"] == "ok" and eager["median_ms"] > 0  # eager is always measured
    assert default["status"] == "unfinished"
    assert default["reason"].startswith("still compiling after ")
    assert default["reason"].endswith(" s, when its time limit ran out")
    assert 0 < default["compile_s_at_least"] < 1.0 + 6  # the limit less eager's time (or one repeat of the alarm)
    assert "median_ms" not in default and "speedup" not in default
    assert aot["status"] == "skipped" and aot["reason"] == "no time left of its 1 s limit"
    assert aot["variant"] == "backend=aot_eager"
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no alarm left armed
    torch.manual_seed(0)
    compiled = torch.compile(make_tiny())  # the interrupted compile left torch usable
    torch.manual_seed(0)
    reference = make_tiny()
    with torch.no_grad():
        torch.testing.assert_close(compiled(*tiny_inputs()), reference(*tiny_inputs()))


def test_compare_with_time_to_spare_reports_as_without_a_limit():
    import signal

    configs = [{"mode": "default"}, {"mode": "reduce-overhead"}, {"backend": "aot_eager"}]
    limited = utils.compare(make_tiny, tiny_inputs(), configs, workload="tiny", device="cpu", min_run_time=0.05,
                            time_limit_s=600)
    unlimited = utils.compare(make_tiny, tiny_inputs(), configs, workload="tiny", device="cpu", min_run_time=0.05)
    assert [r["status"] for r in limited] == ["ok", "ok", "skipped", "ok"]
    assert [utils.describe(r) for r in limited] == [utils.describe(r) for r in unlimited]
    assert [sorted(r) for r in limited] == [sorted(r) for r in unlimited]  # the same fields, no compile_s_at_least
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_compare_without_a_limit_lets_an_enclosing_deadline_through():
    with torch._inductor.config.patch(force_disable_caches=True):
        with pytest.raises(utils.OutOfTime):  # the caller's deadline, not a row of compare's
            with utils.deadline(0.5, every=0.2):
                utils.compare(make_tiny, tiny_inputs(), [{"mode": "default"}], workload="tiny", device="cpu",
                              min_run_time=0.01)
    torch._dynamo.reset()


# --- results files -----------------------------------------------------------------------------

def test_results_round_trip(tmp_path):
    prov = {"gpu": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0", "triton": "3.6.0",
            "python": "3.12.3", "date": "2026-12-02", "preset": "full", "commit": "abc"}
    rows = [{"workload": "w", "variant": "eager", "median_ms": 1.5, "speedup": 1.0},
            {"workload": "w", "variant": "default", "median_ms": float("nan"), "status": "failed",
             "reason": "x"}]
    path = save_results("01_mechanism", rows, prov, root=tmp_path)
    assert path == tmp_path / "h200" / "01_mechanism.json"
    data = load_results(path)
    assert data["provenance"] == prov
    assert data["measurements"][0] == rows[0]
    assert data["measurements"][1]["median_ms"] is None  # NaN is stored as null, valid JSON
    json.loads(path.read_text())


def test_results_refuse_bad_provenance_and_bad_files(tmp_path):
    with pytest.raises(ValueError, match="provenance lacks gpu"):
        save_results("x", [], {"torch": "2", "python": "3", "date": "d", "preset": "full"}, root=tmp_path)
    with pytest.raises(FileNotFoundError, match="run the chapter's notebook"):
        load_results(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a results file"):
        load_results(bad)


# --- plots and widgets -------------------------------------------------------------------------

def test_grouped_bars_draws_one_bar_per_ok_measurement():
    import matplotlib
    matplotlib.use("Agg")
    rows = [{"workload": "b1", "variant": "eager", "speedup": 1.0, "status": "ok"},
            {"workload": "b1", "variant": "default", "speedup": 2.0, "status": "ok"},
            {"workload": "b64", "variant": "eager", "speedup": 1.0, "status": "ok"},
            {"workload": "b64", "variant": "default", "status": "skipped", "reason": "needs a GPU"}]
    ax = utils.grouped_bars(rows, "speedup")
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == [1.0, 1.0, 2.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["eager", "default"]


def test_compile_panel_runs_a_measurement_on_click():
    import matplotlib
    matplotlib.use("Agg")
    panel = utils.compile_panel(make_tiny, lambda batch: tiny_inputs(batch), sizes={"batch 2": 2},
                                device="cpu", min_run_time=0.05)
    buttons = [c for box in panel.children[:3] for c in box.children if getattr(c, "description", "") == "Run"]
    assert len(buttons) == 1
    buttons[0].click()
    assert [r["variant"] for r in panel.rows] == ["eager", "default"]
    assert all(r["status"] == "ok" for r in panel.rows)


def test_glue_stores_what_myst_nb_renders_back_unchanged(monkeypatch):
    from myst_nb.core.variables import format_plain_text

    import IPython.display

    shown = []  # utils.glue imports IPython's display when called (so `import utils` does not)
    monkeypatch.setattr(IPython.display, "display", lambda data, raw, metadata: shown.append((data, metadata)))
    for value in ["5,591", "0.00", "1.50x", "reduce-overhead"]:
        utils.glue("value", value)
    assert len(shown) == 4, "glue displayed nothing through IPython.display.display"
    for (data, metadata), value in zip(shown, ["5,591", "0.00", "1.50x", "reduce-overhead"]):
        assert metadata["scrapbook"] == {"name": "value", "mime_prefix": "application/papermill.record/"}
        assert format_plain_text(data["application/papermill.record/text/plain"], "") == value


# --- papermill runner --------------------------------------------------------------------------

def test_run_book_executes_with_the_preset(tmp_path):
    import nbformat
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('PRESET = "auto"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("print('preset is', PRESET)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    source = tmp_path / "t.ipynb"
    nbformat.write(nb, source)
    from utils.run_book import execute
    out = execute(source, preset="smoke", out_dir=tmp_path / "out")
    executed = nbformat.read(out, as_version=4)
    assert "preset is smoke" in executed.cells[-1].outputs[0]["text"]
    with pytest.raises(FileNotFoundError):
        execute(tmp_path / "nope.ipynb")


# --- deadline: a block that may run too long (chapter 5c) -------------------------------------------

def test_deadline_stops_a_block_that_runs_too_long_even_if_it_catches_exception():
    import signal

    start = time.perf_counter()
    with pytest.raises(utils.OutOfTime, match="still running after"):
        with utils.deadline(0.2):
            try:
                time.sleep(5)
            except Exception:  # code that swallows errors does not swallow the deadline
                pass
    assert time.perf_counter() - start < 2
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # nothing left armed


def test_deadline_fires_again_if_the_block_swallows_it_and_restores_the_handler():
    import signal

    handler_before, caught = signal.getsignal(signal.SIGALRM), 0
    with pytest.raises(utils.OutOfTime):
        with utils.deadline(0.1, every=0.1):
            while True:
                try:
                    time.sleep(1)
                except utils.OutOfTime:
                    caught += 1
                    if caught == 3:
                        raise
    assert caught == 3
    with utils.deadline(5):  # a block that ends in time: no exception
        pass
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is handler_before  # the handler it replaced is back


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_deadline_stops_a_cold_compile_and_torch_compiles_again_afterwards():
    def f(x):
        return torch.sin(x) + x.relu()

    x = torch.randn(64, 64)
    torch._dynamo.reset()
    start = time.perf_counter()
    with torch._inductor.config.patch(force_disable_caches=True):
        with pytest.raises(utils.OutOfTime):
            with utils.deadline(0.3, every=0.2):  # an alarm landing in a weakref callback is lost: the next one is not
                torch.compile(f)(x)
    assert time.perf_counter() - start < 10
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f)(x), f(x))  # the interrupted compile left torch usable


def test_deadline_refuses_a_thread_other_than_main():
    import threading

    errors = []

    def run():
        try:
            with utils.deadline(1):
                pass
        except RuntimeError as error:
            errors.append(str(error))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors and "main thread" in errors[0]


# --- alternating rounds and the speedup they give ------------------------------------------------

def call_groups(order):
    """The names of consecutive runs of calls: ['a', 'a', 'b', 'a'] -> ['a', 'b', 'a']."""
    import itertools

    return [name for name, _ in itertools.groupby(order)]


@pytest.mark.parametrize("names", [("a", "b"), ("eager", "compiled", "other")])
def test_time_interleaved_alternates_the_functions_round_by_round(names):
    order = []
    fns = {name: (lambda name=name: (order.append(name), time.sleep(0.001))) for name in names}
    timed = utils.time_interleaved(fns, rounds=5, min_run_time=0.005, warmup=2)
    # each function's warm-up and probe, then one block of each per round, in the same order
    assert call_groups(order) == list(names) * (1 + 5)
    assert timed.rounds == 5 and all(len(timed.ms[name]) == 5 for name in names)
    assert all(0.9 < ms < 20 for name in names for ms in timed.ms[name])  # a 1 ms call, per call


def test_time_interleaved_ratios_are_per_round():
    fns = {"slow": lambda: time.sleep(0.004), "fast": lambda: time.sleep(0.002)}
    timed = utils.time_interleaved(fns, rounds=5, min_run_time=0.05, warmup=1)
    ratios = timed.ratios("slow", "fast")
    assert ratios == [s / f for s, f in zip(timed.ms["slow"], timed.ms["fast"])]
    assert 1.5 < sorted(ratios)[2] < 2.5
    assert timed.median_ms("slow") == pytest.approx(sorted(timed.ms["slow"])[2])


def fixed_rounds(monkeypatch, eager_ms, compiled_ms):
    """Make compare's alternating rounds return these per-round times; returns the calls it got."""
    import importlib

    from utils.timing import Interleaved

    calls = []

    def fake(fns, *, rounds, min_run_time, **kwargs):
        calls.append((sorted(fns), rounds))
        return Interleaved(ms={"eager": list(eager_ms), "compiled": list(compiled_ms)}, rounds=rounds)

    # utils.compare is the function: the module is utils.compare in sys.modules
    monkeypatch.setattr(importlib.import_module("utils.compare"), "time_interleaved", fake)
    return calls


def test_compare_speedup_is_the_median_of_per_round_ratios(monkeypatch):
    # per-round ratios 1, 2, 3, 4, 1: median 2; the ratio of the medians would be 3 / 1 = 3
    calls = fixed_rounds(monkeypatch, eager_ms=[1, 2, 3, 4, 5], compiled_ms=[1, 1, 1, 1, 5])
    eager, compiled = utils.compare(make_tiny, tiny_inputs(), [{"backend": "eager"}], workload="tiny",
                                    device="cpu", min_run_time=0.05, rounds=5)
    assert calls == [(["compiled", "eager"], 5)]
    assert compiled["status"] == "ok"
    assert compiled["speedup"] == 2.0
    assert (compiled["speedup_lo"], compiled["speedup_hi"]) == (1.0, 4.0)
    assert compiled["eager_ms"] == 3.0 and compiled["median_ms"] == 1.0  # both from the same rounds
    assert compiled["rounds"] == 5
    assert compiled["gpu_ms"] is None and compiled["peak_mem_gb"] is None  # no GPU here: none, not a guess
    assert eager["speedup"] == 1.0 and eager["median_ms"] > 0  # eager's own row is timed on its own


def test_compare_p10_and_p90_are_percentiles_of_the_rounds(monkeypatch):
    # the eager row's p10_ms and p90_ms are the 10th and 90th percentiles of its timed blocks; a
    # compiled row's must be the same statistic of its rounds, not their minimum and maximum
    fixed_rounds(monkeypatch, eager_ms=[2] * 5, compiled_ms=[1, 1, 1, 1, 5])
    compiled = utils.compare(make_tiny, tiny_inputs(), [{"backend": "eager"}], workload="tiny", device="cpu",
                             min_run_time=0.05, rounds=5)[1]
    p10, p90 = utils.timing.quantiles([1, 1, 1, 1, 5], (0.1, 0.9))
    assert (compiled["p10_ms"], compiled["p90_ms"]) == (pytest.approx(p10), pytest.approx(p90))


# --- tables --------------------------------------------------------------------------------------

TABLE_ROWS = [
    {"workload": "batch 1", "variant": "eager", "median_ms": 2.0, "speedup": 1.0, "speedup_lo": 1.0,
     "speedup_hi": 1.0, "compile_s": 0.0, "status": "ok"},
    {"workload": "batch 1", "variant": "default", "median_ms": 1.25, "speedup": 1.6, "speedup_lo": 1.42,
     "speedup_hi": 1.75, "eager_ms": 2.0, "compile_s": 12.5, "gpu_ms": None, "status": "ok"},
    {"workload": "batch 1", "variant": "reduce-overhead", "status": "failed", "reason": "out of GPU memory <8 GB>"},
    {"workload": "batch 1", "variant": "max-autotune", "status": "skipped", "reason": "needs a GPU"},
]


def parsed_table(table):
    """The table's HTML as an element tree (it must be well-formed), and its body rows."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(table._repr_html_())
    assert root.tag == "table"
    return root, root.findall("./tbody/tr")


def test_table_renders_html_with_a_row_per_measurement():
    from utils.tables import COLUMNS, Table

    root, rows = parsed_table(Table(TABLE_ROWS, COLUMNS))
    headers = [th.text for th in root.findall("./thead/tr/th")]
    assert headers[:5] == ["workload", "variant", "median ms", "eager ms", "speedup"] and len(headers) == len(COLUMNS)
    assert len(rows) == 4
    default = [td.text for td in rows[1]]
    assert default[:5] == ["batch 1", "default", "1.25", "2.00", "1.60x (1.42-1.75)"]  # eager of the same rounds, the speedup with its range
    assert default[COLUMNS.index("gpu_ms")] == "-"  # not measured: a dash, not 0
    assert [td.text for td in rows[0]][3:5] == ["-", "1.00x"]  # eager has no eager beside it; no range without spread


def test_table_failed_row_spans_the_columns_with_its_reason():
    from utils.tables import COLUMNS, Table

    _, rows = parsed_table(Table(TABLE_ROWS, COLUMNS))
    for row, text in [(rows[2], "failed: out of GPU memory <8 GB>"), (rows[3], "skipped: needs a GPU")]:
        cells = list(row)
        assert [c.text for c in cells] == ["batch 1", row[1].text, text]  # escaped in the HTML, read back whole
        assert sum(int(c.get("colspan", 1)) for c in cells) == len(COLUMNS)
    assert 'colspan="9">failed: out of GPU memory &lt;8 GB&gt;</td>' in Table(TABLE_ROWS, COLUMNS)._repr_html_()


def test_table_as_text_lines_up_and_says_why():
    from utils.tables import Table

    lines = repr(Table(TABLE_ROWS, ("workload", "variant", "median_ms", "speedup"))).splitlines()
    assert len(lines) == 5
    assert lines[2].split() == ["batch", "1", "default", "1.25", "1.60x", "(1.42-1.75)"]
    assert lines[0].index("speedup") + len("speedup") == len(lines[2])  # right-aligned under its header
    assert lines[3].endswith("reduce-overhead  failed: out of GPU memory <8 GB>")


def test_show_table_displays_a_table(monkeypatch):
    import IPython.display

    from utils.tables import Table

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    utils.show_table(TABLE_ROWS)
    assert len(shown) == 1 and isinstance(shown[0], Table) and "<table" in shown[0]._repr_html_()


# --- importing the library -------------------------------------------------------------------------

def test_import_utils_loads_neither_ipython_nor_ipywidgets():
    import subprocess
    import sys

    from conftest import REPO

    code = ("import sys, utils\n"
            "loaded = lambda: sorted({m.split('.')[0] for m in sys.modules} & {'IPython', 'ipywidgets'})\n"
            "print(loaded())\n"
            "utils.show_table, utils.compile_panel\n"  # the lazy names do load them
            "print(loaded())\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-2:] == ["[]", "['IPython', 'ipywidgets']"]


def test_ratio_text_gives_the_rounds_range_or_says_what_is_missing():
    from utils import ratio_text

    row = {"speedup": 2.104, "speedup_lo": 1.9, "speedup_hi": 2.3, "speedup_vs_original": 1.5}
    assert ratio_text(row) == "2.10x (rounds 1.90-2.30x)"
    assert ratio_text(row, "speedup_vs_original") == "1.50x"  # no rounds stored: the ratio alone
    assert ratio_text(None) == "not measured" and ratio_text({}, missing="on a GPU only") == "on a GPU only"


def test_count_text_puts_the_noun_in_the_right_number():
    from utils import count_text

    assert [count_text(n, "graph") for n in (0, 1, 2)] == ["0 graphs", "1 graph", "2 graphs"]
    assert count_text(1, "graph break") == "1 graph break" and count_text(3, "graph break") == "3 graph breaks"
    assert count_text(2, "copy", "copies") == "2 copies"


def test_rounds_verdict_says_where_all_the_rounds_lie():
    from utils import rounds_verdict

    row = {"speedup": 1.5, "speedup_lo": 1.2, "speedup_hi": 1.8}
    assert rounds_verdict(row) == "faster than eager in every round"
    assert rounds_verdict({**row, "speedup_lo": 0.6, "speedup_hi": 0.9}, than="default") == \
        "slower than default in every round"
    assert rounds_verdict({**row, "speedup_lo": 0.9}).startswith("neither consistently faster nor slower than eager")
    assert rounds_verdict(None) == rounds_verdict({"speedup": None}) == "not measured here"


def test_max_autotune_is_left_out_on_a_gpu_with_too_few_sms_and_says_why(monkeypatch, fake_h200, capsys):
    """A T4 (40 SMs) gets no max-autotune variants and a printed reason; an H200 (132 SMs) and a CPU keep them."""
    from torch._inductor.utils import is_big_gpu

    variants = [{"mode": "default"}, {"mode": "max-autotune-no-cudagraphs"}, "reduce-overhead",
                {"options": {"max_autotune_gemm_backends": "ATEN"}}, "max-autotune"]
    # the threshold is Inductor's own
    assert f"min_sms = 16 if device.type == \"xpu\" else {utils.env.MAX_AUTOTUNE_MIN_SMS}" in \
        inspect.getsource(is_big_gpu)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i=0: types.SimpleNamespace(name="NVIDIA H200", total_memory=int(150e9),
                                                          multi_processor_count=132))
    assert utils.without_max_autotune(variants, "cuda") == variants and utils.max_autotune_skip_reason("cuda") is None
    assert utils.without_max_autotune(variants, "cpu") == variants
    assert capsys.readouterr().out == ""
    monkeypatch.setenv(utils.env.SIMULATE_ENV, "t4")
    assert utils.without_max_autotune(variants, "cuda") == [{"mode": "default"}, "reduce-overhead"]
    assert "Tesla T4 has 40 SMs" in capsys.readouterr().out


def test_a_simulated_small_gpu_reports_its_own_free_memory(monkeypatch, fake_h200):
    """Under a simulated T4, torch.cuda.mem_get_info reports at most the T4's 15 GB less what the process holds."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (140e9, 150e9))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: int(4e9))
    monkeypatch.setenv(utils.env.SIMULATE_ENV, "t4")
    utils.choose_preset()
    assert torch.cuda.mem_get_info() == (int(11e9), int(15e9))
    assert getattr(torch.cuda.mem_get_info, "simulated", False)
