"""Chapter 7: the cold-start worker in fresh processes, the FastAPI server on the CPU (start, good and bad
requests, restart), and the break-even helpers of "When not to compile". Tiny models (the smoke preset);
the session's warm inductor cache (tests/conftest.py)."""
import json
import os
import re
import subprocess
import sys
import threading

import pytest

from conftest import REPO
from utils import break_even, cold_start, llm, serve_app, serving
from utils.benchmarks import ResultsError
from utils.compare import break_even_calls

NOTEBOOK = REPO / "notebooks" / "draft-07_deployment.ipynb"
CACHE = os.environ["TORCHINDUCTOR_CACHE_DIR"]
SEQ, VOCAB = cold_start.SIZES["smoke"]["lm"]["seq_len"], cold_start.SIZES["smoke"]["lm"]["vocab"]


# --- the request checks, without a server ------------------------------------------------------------

@pytest.mark.parametrize("name, body", serving.bad_requests(SEQ, 4))
def test_each_bad_request_is_refused_with_a_4xx(name, body):
    with pytest.raises(serve_app.BadRequest) as error:
        serve_app.parse_tokens(body, SEQ, VOCAB, 4)
    expected = {"malformed JSON": 400, "wrong shape": 422, "oversized batch": 413, "wrong dtype": 422}[name]
    assert error.value.status == expected and error.value.message


def test_good_rows_pass_and_buckets_pad_up():
    rows = serving.good_payload(3, SEQ, VOCAB)["tokens"]
    assert serve_app.parse_tokens(json.dumps({"tokens": rows}), SEQ, VOCAB, 4) == rows
    assert [serve_app.bucket_for(n, (1, 2, 4, 8)) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    for bad in ({"tokens": [[True] * SEQ]}, {"tokens": [[VOCAB] * SEQ]}, {"tokens": []}, [[1] * SEQ]):
        with pytest.raises(serve_app.BadRequest):
            serve_app.parse_tokens(json.dumps(bad), SEQ, VOCAB, 4)


def test_load_summary():
    row = serving.summarize([0.001 * k for k in range(1, 101)], failures=2, seconds=2.0)
    assert row["ok"] == 100 and row["failed"] == 2 and row["rps"] == 50.0
    assert row["p50_ms"] == pytest.approx(50.5) and 98 < row["p99_ms"] <= 100


# --- the worker: one fresh process per cold start ----------------------------------------------------

def test_worker_times_each_phase_of_an_eager_start(tmp_path):
    row = cold_start.measure("lm", "eager", "smoke", tmp_path / "cache")
    assert row["status"] == "ok", row
    assert all(row[k] >= 0 for k in ("import_s", "load_s", "prepare_s", "first_call_s", "steady_ms"))
    assert row["first_result_s"] >= row["import_s"] + row["load_s"] + row["first_call_s"] - 1e-3
    assert row["process_s"] >= row["first_result_s"] and row["graphs"] == 0 and row["max_abs_err"] == 0


def test_worker_compiles_from_a_warm_cache(tmp_path):
    row = cold_start.measure("lm", "compile", "smoke", CACHE, save_mega=tmp_path / "mega.bin")
    assert row["status"] == "ok", row
    assert row["graphs"] == 1 and row["fx_hit"] + row["fx_miss"] >= 1 and row["max_abs_err"] < 1e-4
    assert (tmp_path / "mega.bin").stat().st_size > 0


@pytest.mark.slow
def test_the_ahead_of_time_paths_run_in_bfloat16(tmp_path, monkeypatch):
    """The GPU's dtype tried on a CPU where a dtype bug would show first: the package and the precompiled function
    built and loaded in fresh processes, and the AOTInductor server's engine (the chapter's smoke run is in float32).
    The package's load with the CPU check skipped compiles no probe into its empty cache folder."""
    monkeypatch.setenv("BOOK_DTYPE", "bfloat16")  # inherited by the worker processes and read by the engine
    rows = cold_start.sequence("lm", "smoke", tmp_path / "cold", paths="aot")
    assert [r["status"] for r in rows] == ["ok"] * 6, [r.get("reason") for r in rows]
    assert "AOTInductor package, CPU check skipped" in [r["variant"] for r in rows]
    probes = {folder: list((tmp_path / "cold" / folder).rglob("*.so")) for folder in ("aoti", "aoti_nocheck")}
    assert probes["aoti"] and not probes["aoti_nocheck"], probes  # the first load compiled the ISA probes there
    loaded = [r for r in rows if not r["variant"].endswith("build")]
    assert all(r["dtype"] == "torch.bfloat16" and r["max_abs_err"] < 0.1 for r in loaded), loaded
    engine = serve_app.Engine("aoti", "smoke", tmp_path, buckets=(1, 2), device="cpu")
    engine.warm_up()
    assert str(next(engine.served.parameters()).dtype) == "torch.bfloat16"
    tokens = serving.good_payload(2, SEQ, VOCAB)["tokens"]
    next_tokens = engine.infer(tokens)
    assert next_tokens == engine.infer(tokens) and len(next_tokens) == 2 and all(0 <= t < VOCAB for t in next_tokens)


def test_an_unknown_group_of_cold_starts_is_refused_before_any_process_starts(tmp_path):
    with pytest.raises(ValueError, match="choose jit, max-autotune or aot"):
        cold_start.sequence("lm", "smoke", tmp_path, paths="fast")
    assert not any(tmp_path.iterdir())


def test_worker_command_line_rejects_bad_input():
    for args, message in ((["--model", "vit", "--path", "eager"], "invalid choice: 'vit'"),
                          (["--model", "lm", "--path", "compile", "--mode", "fast"], "invalid choice: 'fast'"),
                          (["--model", "lm", "--path", "aoti"], "--path aoti needs --artifact"),
                          (["--model", "lm", "--path", "eager", "--skip-cpu-check"], "--skip-cpu-check is for --path aoti")):
        proc = subprocess.run([sys.executable, "-m", "utils.cold_start", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-500:]


# --- the server ----------------------------------------------------------------------------------------

def test_the_model_thread_batches_waiting_requests_up_to_the_largest_bucket(tmp_path):
    engine = serve_app.Engine("eager", "smoke", tmp_path, buckets=(1, 2, 4), device="cpu")
    requests = [serving.good_payload(n, SEQ, VOCAB, seed=k)["tokens"] for k, n in enumerate((1, 2, 1, 3, 1))]
    answers = [engine.submit(rows) for rows in requests]  # all waiting before the thread starts
    threading.Thread(target=engine.run_batches, daemon=True).start()
    assert [a.result(timeout=60) for a in answers] == [engine.infer(rows) for rows in requests]
    assert (engine.stats["batches"], engine.stats["batched_rows"]) == (2, 8)  # 1+2+1 rows, then 3+1

    def broken(rows):
        raise RuntimeError("the model failed")

    engine.infer = broken
    with pytest.raises(RuntimeError, match="the model failed"):
        engine.submit(requests[0]).result(timeout=60)
    assert engine.stats["batches"] == 2


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The compiled server on the CPU, warm from the session's inductor cache."""
    srv = serving.start("compiled", tmp_path_factory.mktemp("serve"), buckets=(1, 2, 4), cache_dir=CACHE, timeout=600)
    yield srv
    serving.stop(srv)


def test_server_answers_a_good_request(server):
    status, answer = serving.post(server.url, serving.good_payload(3, SEQ, VOCAB))
    assert status == 200 and len(answer["next_token"]) == 3 and all(0 <= t < VOCAB for t in answer["next_token"])


def test_server_refuses_bad_requests_and_keeps_serving(server):
    for name, body in serving.bad_requests(SEQ, 4):
        status, answer = serving.post(server.url, body)
        assert 400 <= status < 500 and answer["error"], (name, status, answer)
        assert serving.post(server.url, serving.good_payload(1, SEQ, VOCAB))[0] == 200, f"not serving after {name}"
    report = serving.stats(server)
    assert report["bad_requests"] >= 4 and report["recompiles"] == 0 and report["mode"] == "compiled"


def test_server_under_load_does_not_recompile(server):
    payloads = [serving.good_payload(b, SEQ, VOCAB, seed=b) for b in (1, 2, 3, 4)]
    row = serving.load(server.url, payloads, concurrency=2, max_requests=20, max_seconds=30)
    assert row["ok"] == 20 and row["failed"] == 0 and row["p50_ms"] > 0
    assert serving.stats(server)["recompiles"] == 0


def test_server_restarts_warm_after_a_kill(server):
    serving.stop(server, kill=True)
    again = serving.restart(server)
    try:
        assert again.ready_s > 0 and serving.stats(again)["mega_loaded"] is True
        assert serving.post(again.url, serving.good_payload(2, SEQ, VOCAB))[0] == 200
    finally:
        serving.stop(again)


# --- when not to compile: the break-even helpers (section 5) ---------------------------------------------

def test_calls_to_repay_is_the_break_even_or_says_why_not():
    assert break_even.calls_to_repay(6.0, 2.0, 1.4) == pytest.approx(break_even_calls(6.0, 2.0, 1.4)) == \
        pytest.approx(10_000)
    assert break_even.calls_to_repay(6.0, 2.0, 2.0) is None and break_even.calls_to_repay(6.0, 2.0, 2.5) is None
    assert break_even.calls_to_repay(-1.0, 2.0, 1.0) == 0.0 and break_even.calls_to_repay(0.0, 2.0, 1.0) == 0.0
    assert break_even.calls_to_repay(None, 2.0, 1.0) is None


def test_job_totals_meet_at_the_break_even():
    calls = break_even.calls_to_repay(40.0, 26.0, 7.0)  # the arithmetic of the exercise ex-deploy-breakeven
    assert calls == pytest.approx(2105.26, abs=0.01)
    assert break_even.job_seconds(calls, 26.0) == pytest.approx(break_even.job_seconds(calls, 7.0, 40.0))
    assert break_even.job_seconds(2000, 26.0) == pytest.approx(52.0)
    assert break_even.job_seconds(2000, 7.0, 40.0) == pytest.approx(54.0)
    assert break_even.calls_to_repay(8.0, 26.0, 7.0) == pytest.approx(421.05, abs=0.01)
    assert [break_even.calls_text(c) for c in (None, 0.0, 17803.9)] == ["never", "0", "17,804"]
    assert break_even.calls_text(5.0, measured=False) == "-"
    assert break_even.break_even_text(2105.3, "steps") == "2,105 steps"
    assert break_even.break_even_text(None) == "never (compiled is not faster)"


def test_eager_time_comes_from_the_same_rounds_or_the_rows_own_ratio():
    assert break_even.eager_ms_of({"eager_ms": 2.0, "median_ms": 1.0, "speedup": 3.0}) == 2.0
    assert break_even.eager_ms_of({"median_ms": 1.5, "speedup": 2.0}) == 3.0
    assert break_even.eager_ms_of({"median_ms": 1.5}) is None


def write_results(path, rows):
    path.write_text(json.dumps({"provenance": {"gpu": "NVIDIA H200", "torch": "2.11", "python": "3.11",
                                               "date": "2026-12-01", "preset": "full"}, "measurements": rows}))
    return path


BOOK_ROWS = [
    {"workload": "batch 1", "variant": "eager", "status": "ok", "median_ms": 2.0, "compile_s": 0.0, "speedup": 1.0},
    {"workload": "batch 1", "variant": "backend=eager", "backend": "eager", "status": "ok", "median_ms": 1.9,
     "eager_ms": 2.0, "compile_s": 0.5, "speedup": 1.05},
    {"workload": "batch 1", "variant": "default", "backend": "inductor", "status": "ok", "median_ms": 1.5,
     "eager_ms": 2.0, "compile_s": 0.7, "speedup": 1.33},
    {"workload": "batch 1", "variant": "reduce-overhead", "status": "ok", "median_ms": 0.5, "speedup": 4.0,
     "compile_s": 4.5},
    {"workload": "batch 1", "variant": "max-autotune", "status": "failed", "reason": "out of GPU memory"},
    {"workload": "batch 1", "variant": "default cold/warm", "status": "ok", "compile_s": 7.0, "warm_compile_s": 1.5},
    {"workload": "batch 64", "variant": "default", "status": "ok", "median_ms": 11.0, "eager_ms": 10.0,
     "compile_s": 6.0, "speedup": 0.91},
    {"workload": "batch 64", "variant": "reduce-overhead", "status": "ok", "median_ms": 10.5, "eager_ms": 10.0,
     "compile_s": 6.0, "speedup": 0.95},
]


def test_file_presets_keep_compiled_rows_with_a_compile_and_an_eager_baseline(tmp_path):
    presets = break_even.file_presets(write_results(tmp_path / "01_mechanism.json", BOOK_ROWS))
    assert [(p["workload"], p["variant"]) for p in presets] == [
        ("batch 1", "default"), ("batch 1", "reduce-overhead"), ("batch 64", "default"), ("batch 64", "reduce-overhead")]
    default, overhead = presets[0], presets[1]
    assert default["chapter"] == "1" and default["file"] == "01_mechanism.json"
    # chapter 1's "default cold/warm" row gives the default's cold and warm compile (7 s, 1.5 s), not its 0.7 s
    assert (default["cold_s"], default["warm_s"]) == (7.0, 1.5)
    assert default["calls_cold"] == pytest.approx(14_000) and default["calls_warm"] == pytest.approx(3_000)
    assert overhead["eager_ms"] == pytest.approx(2.0) and overhead["warm_s"] is None  # median_ms x speedup
    assert overhead["calls_cold"] == pytest.approx(3_000) and overhead["calls_warm"] is None


def test_measured_presets_pick_per_workload_the_variant_repaid_soonest(tmp_path):
    write_results(tmp_path / "01_mechanism.json", BOOK_ROWS)
    presets = break_even.measured_presets(tmp_path)
    picked = [(p["workload"], p["variant"]) for p in presets]
    # batch 1: reduce-overhead repays soonest, the default stays for its warm compile; batch 64: neither
    # repays, the one nearer eager stands for it
    assert picked == [("batch 1", "default"), ("batch 1", "reduce-overhead"), ("batch 64", "reduce-overhead")]
    assert presets[-1]["calls_cold"] is None
    shown = break_even.table_rows(presets)
    assert [(r["calls_cold"], r["calls_warm"]) for r in shown] == [("14,000", "3,000"), ("3,000", "-"), ("never", "-")]


@pytest.mark.parametrize("content, message", [
    ("", "the results file is empty"),
    ("{not json", "not valid JSON"),
    ('{"measurements": []}', "not a results file"),
])
def test_a_malformed_results_file_is_named(tmp_path, content, message):
    (tmp_path / "02_training.json").write_text(content)
    with pytest.raises(ResultsError, match=message) as error:
        break_even.measured_presets(tmp_path)
    assert "02_training.json" in str(error.value)


def test_a_measurement_that_is_not_a_number_is_named(tmp_path):
    rows = [{"workload": "step", "variant": "default", "status": "ok", "median_ms": "fast", "speedup": 1.2,
             "compile_s": 3.0}]
    write_results(tmp_path / "04_gnn.json", rows)
    with pytest.raises(ResultsError, match=r"04_gnn.json: measurement 0 \(step, default\): median_ms is 'fast'"):
        break_even.measured_presets(tmp_path)


def test_a_chapter_can_leave_its_own_results_out(tmp_path):
    write_results(tmp_path / "01_mechanism.json", BOOK_ROWS)
    write_results(tmp_path / "07_deployment.json", [{**BOOK_ROWS[2], "workload": "lm one token"}])
    assert {p["chapter"] for p in break_even.measured_presets(tmp_path)} == {"1", "7"}
    assert {p["chapter"] for p in break_even.measured_presets(tmp_path, exclude=("07_deployment",))} == {"1"}
    with pytest.raises(ResultsError, match="no results files"):
        break_even.measured_presets(tmp_path, exclude=("01_mechanism", "07_deployment"))


def test_a_missing_results_folder_is_named(tmp_path):
    with pytest.raises(ResultsError, match="h100: no results files"):
        break_even.measured_presets(tmp_path / "h100")


def test_the_books_results_give_presets():
    presets = break_even.measured_presets(REPO / "results" / "h200")
    assert presets and all(p["eager_ms"] > 0 and p["compiled_ms"] > 0 and p["cold_s"] > 0 for p in presets)
    for p in presets:
        assert p["calls_cold"] == break_even.calls_to_repay(p["cold_s"], p["eager_ms"], p["compiled_ms"])
    assert not any(str(p["variant"]).startswith(("eager", "backend=")) for p in presets)


def test_server_presets_charge_the_start_beyond_eagers():
    starts = [{"variant": "eager", "ready_s": 5.0}, {"variant": "compiled", "ready_s": 20.0},
              {"variant": "cudagraphs", "ready_s": 25.0}, {"variant": "aoti", "ready_s": 60.0}]
    restarts = [{"variant": "compiled", "ready_s": 9.0}, {"variant": "aoti", "ready_s": 4.0}]
    rows = [{"variant": "eager", "concurrency": 1, "p50_ms": 3.0},
            {"variant": "compiled", "concurrency": 1, "p50_ms": 2.5, "speedup": 1.2},
            {"variant": "aoti", "concurrency": 1, "p50_ms": 2.0, "speedup": 1.5},
            {"variant": "cudagraphs", "concurrency": 1, "p50_ms": 1.0, "speedup": 3.0},
            {"variant": "compiled", "concurrency": 4, "p50_ms": 9.0}]
    compiled, graphs, aoti = break_even.server_presets(starts, restarts, rows, concurrency=1)
    assert (graphs["variant"], graphs["cold_s"], graphs["warm_s"]) == ("torch.compile, CUDA graphs", 20.0, None)
    assert (compiled["cold_s"], compiled["warm_s"], compiled["calls_cold"]) == (15.0, 4.0, pytest.approx(30_000))
    assert (aoti["cold_s"], aoti["warm_s"], aoti["calls_warm"]) == (55.0, -1.0, 0.0)  # a restart faster than eager's
    assert compiled["chapter"] == "7" and compiled["speedup"] == 1.2
    assert break_even.server_presets(starts, [], rows[:2], concurrency=1)[0]["warm_s"] is None
    assert break_even.server_presets(starts, restarts, rows, concurrency=16) == []


def test_plot_totals_draws_eager_and_each_start():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    break_even.plot_totals(ax, 26.0, 7.0, {"cold start": 40.0, "warm start": 8.0, "not measured": None}, 5000)
    labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert labels == ["eager", "compiled, cold start", "compiled, warm start"]
    marks = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert len(marks) == 2 and marks[1].get_xdata()[0] == pytest.approx(8000 / 19)
    plt.close(fig)


def test_the_deployment_paths_the_chapter_names_exist_in_this_torch():
    import torch

    assert callable(torch.compiler.save_cache_artifacts) and callable(torch.compiler.load_cache_artifacts)
    assert callable(torch._inductor.aoti_compile_and_package) and callable(torch._inductor.aoti_load_package)
    assert callable(torch.compiler.load_compiled_function)
    assert hasattr(torch.compile(lambda t: t + 1, fullgraph=True), "aot_compile")
    assert torch._dynamo.config.recompile_limit == 8  # the solution of ex-deploy-shapes says eight by default


# --- the draft chapter -------------------------------------------------------------------------------

def test_draft_has_the_chapter_shape(repository_url):
    from test_notebooks import check_draft_shape

    code, prose = check_draft_shape(NOTEBOOK, repository_url)
    assert 'utils.Run("07_deployment", PRESET_NAME, P)' in code and "run.part(" in code
    assert "experimental" in prose and "fail_on_recompile" in prose


@pytest.mark.slow
def test_draft_runs_in_smoke_preset_on_cpu(tmp_path, monkeypatch):
    from test_notebooks import run_draft_smoke

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    nb, text = run_draft_smoke(NOTEBOOK, tmp_path)
    assert "in torch.float32" in text  # a reader's CPU; bfloat16 is tried in test_the_ahead_of_time_paths_run_in_bfloat16
    assert "bad requests: 4 refused with a 4xx" in text and "recompiles under load: 0" in text
    assert "did not start" not in text  # every server mode, CUDA graphs and AOTInductor included, served on the CPU
    assert "graphs compiled: dynamic=None 2, dynamic=True 1" in text  # section 5: a recompile, then symbolic sizes
    assert "the model: 2 graphs, 1 graph break:" in text and "steady calls: eager" in text
    glued = {o["metadata"]["scrapbook"]["name"]: o["data"]["application/papermill.record/text/plain"] for c in nb["cells"]
             for o in c.get("outputs", []) if o.get("metadata", {}).get("scrapbook")}
    assert re.search(r"ms eager, [0-9.]+ ms compiled, at a batch of 2", glued["lm_step_verdict"])  # why the servers differ
    assert "no Triton kernels to profile on this device" in text  # section 4's profile is for a GPU
    assert "not measured here" in glued["mlp_kernels"]
    assert "no profile to read" in glued["int8pack_note"] and "not compared here" in glued["mlp_cd_compare"]
    # the package is loaded twice, into an empty cache folder and into the folder the first load left
    assert re.fullmatch(r"'[0-9.]+ s'", glued["lm_aoti_load_s"]) and re.fullmatch(r"'[0-9.]+ s'", glued["lm_aoti_warm_load_s"])
    # the max-autotune group: a cold compile, then a warm cache and Mega-Cache, and how much sooner the best of them was
    assert all(re.fullmatch(r"'[0-9.]+ s'", glued[f"lm_{name}_s"]) for name in ("tuned", "tuned_warm", "tuned_megacache"))
    assert re.fullmatch(r"'[0-9.]+x (sooner|later)'", glued["lm_tuned_ratio"])


CRASH = ("/usr/lib/python3.12/copyreg.py:99: FutureWarning: ...\n  return cls.__new__(cls, *args)\n"
         "Fatal Python error: Segmentation fault\n\nThread 0x7f1 (most recent call first):\n"
         '  File "/opt/v/lib/python3.12/site-packages/torch/_inductor/compile_worker/subproc_pool.py", line 76 in _recv_msg\n'
         '  File "/usr/lib/python3.12/threading.py", line 1010 in run\n\n'
         "Current thread 0x7f2 (most recent call first):\n"
         '  File "/opt/v/lib/python3.12/site-packages/torch/export/pt2_archive/_package.py", line 1045 in _load_aoti\n'
         '  File "/opt/v/lib/python3.12/site-packages/torch/_inductor/package/package.py", line 110 in load_package\n'
         '  File "/x/utils/serve_app.py", line 90 in _ready\n  File "<frozen runpy>", line 88 in _run_code\n\n'
         "Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)\n")  # as faulthandler wrote it on the GPU


def test_a_crashed_servers_log_gives_the_error_and_where_it_happened(tmp_path):
    log = tmp_path / "aoti.log"
    log.write_text(CRASH)
    assert serving.tail(log) == ('Fatal Python error: Segmentation fault | '
                                 'File "torch/export/pt2_archive/_package.py", line 1045 in _load_aoti | '
                                 'File "torch/_inductor/package/package.py", line 110 in load_package | '
                                 'File "/x/utils/serve_app.py", line 90 in _ready')
    log.write_text("one\ntwo\nthree\nfour\n")
    assert serving.tail(log) == "two | three | four"
    assert serving.tail(tmp_path / "missing.log") == "no output"


def test_a_cold_start_worker_that_dies_says_how_and_where():
    assert cold_start.exit_reason(-11, CRASH).startswith(
        'killed by SIGSEGV: Fatal Python error: Segmentation fault | File "torch/export/pt2_archive/_package.py"')
    assert cold_start.exit_reason(1, "Traceback ...\nValueError: bad") == "exited with 1: ValueError: bad"
    assert cold_start.exit_reason(1, "") == "exited with 1: no output"


def test_triton_sources_cuts_each_kernel_out_of_inductors_code():
    quotes = "'" * 3
    code = "\n".join([
        f"triton_red_fused_mm_0 = async_compile.triton('triton_red_fused_mm_0', {quotes}",
        "import triton", "@triton_heuristics.reduction(size_hints={'x': 4096})", "@triton.jit",
        "def triton_red_fused_mm_0(in_ptr0, out_ptr0, xnumel, r0_numel):", "    tmp0 = tl.load(in_ptr0 + r0_1)",
        f"{quotes}, device_str='cuda')",
        f"triton_poi_fused_silu_1 = async_compile.triton('triton_poi_fused_silu_1', {quotes}",
        "@triton.jit", "def triton_poi_fused_silu_1(in_ptr0):", "    pass", f"{quotes}, device_str='cuda')",
        "extern_kernels.mm(buf0, arg1_1, out=buf1)"])
    sources = llm.triton_sources(code)
    assert list(sources) == ["triton_red_fused_mm_0", "triton_poi_fused_silu_1"]
    assert sources["triton_red_fused_mm_0"].startswith("@triton.jit\ndef triton_red_fused_mm_0(")
    assert "tl.load(in_ptr0 + r0_1)" in sources["triton_red_fused_mm_0"] and "heuristics" not in sources["triton_red_fused_mm_0"]
    assert llm.triton_sources("cpp_fused_0 = async_compile.cpp_pybinding(['float*'], '''...''')") == {}
