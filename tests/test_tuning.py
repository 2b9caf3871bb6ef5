"""Chapter 6's helpers (utils/tuning.py) and its draft notebook (notebooks/draft-06_tuning.ipynb)."""
import os
import sys

import pytest
import torch
import torch._dynamo

from conftest import REPO, build_small_sphinx
import utils.compiler
from utils import tuning

NOTEBOOK = REPO / "notebooks" / "draft-06_tuning.ipynb"
REPOSITORY_URL = "https://github.com/torch-compile-book/torch-compile-book"


def test_clean_log_drops_the_prefix():
    line = ("V1204 18:19:46.838000 26083 /x/torch/_dynamo/symbolic_convert.py:5375] [0/1] [__graph_breaks] "
            "Graph Break Reason: Data-dependent branching")
    assert tuning.clean_log(line + "\n\n") == ["Graph Break Reason: Data-dependent branching"]


def test_captured_logs_catches_a_recompile_and_lets_go_of_stderr(capsys):
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 1, backend="eager", dynamic=False)
    with tuning.captured_logs(recompiles=True) as lines:
        fn(torch.randn(3))
        fn(torch.randn(4))
    assert any("size mismatch" in line or "triggered by" in line for line in lines), lines
    assert capsys.readouterr().err == "", "the logs leaked to stderr"
    assert sys.stderr is sys.__stderr__ or "pytest" in type(sys.stderr).__module__


def test_breaks_counts_a_data_dependent_branch():
    def branchy(x):
        return x * 2 if x.sum() > 0 else x - 1

    found = tuning.breaks(branchy, torch.ones(4))
    assert found["graph_breaks"] == 1 and found["graphs"] == 2 and len(found["reasons"]) == 1


def test_count_compiles_counts_graphs_and_the_limit():
    calls = [lambda f, n=n: f(torch.randn(n)) for n in range(1, 5)]
    result = tuning.count_compiles(torch.sin, calls, backend="eager", dynamic=False)
    assert result["graphs"] == 4 and result["calls"] == 4 and not result["hit_limit"]
    with torch._dynamo.config.patch(recompile_limit=2):
        limited = tuning.count_compiles(torch.sin, calls, backend="eager", dynamic=False)
    assert limited["graphs"] == 2 and limited["hit_limit"]


def test_config_has_names_what_is_missing():
    assert tuning.config_has({"epilogue_fusion": False, "triton.cudagraphs": True}) == []
    assert tuning.config_has({"no_such_knob": 1, "triton.no_such": 2}) == ["no_such_knob", "triton.no_such"]


def test_knob_rows_skips_without_compiling():
    missing = tuning.knob_rows(None, (), {"name": "x", "inductor": {"no_such_knob": True}}, workload="w", device="cpu")
    assert missing[0]["status"] == "skipped" and "no_such_knob" in missing[0]["reason"]
    gpu = tuning.knob_rows(None, (), {"name": "y", "inductor": {"combo_kernels": True}, "gpu_only": "GPU only"},
                           workload="w", device="cpu")
    assert gpu[0]["status"] == "skipped" and gpu[0]["reason"] == "GPU only"


def test_knob_rows_measures_a_setting_against_eager():
    rows = tuning.knob_rows(lambda: torch.nn.Linear(8, 8), (torch.randn(4, 8),),
                            {"name": "epilogue_fusion off", "inductor": {"epilogue_fusion": False}},
                            workload="w", device="cpu", min_run_time=0.01, rounds=3)
    assert [r["variant"] for r in rows] == ["eager", "epilogue_fusion off"]
    assert rows[1]["status"] == "ok" and rows[1]["speedup"] > 0 and rows[1]["knob"] == "epilogue_fusion off"


def test_a_knob_in_a_cold_cache_compiles_in_a_folder_of_its_own(tmp_path):
    def knob(**kw):
        rows = tuning.knob_rows(lambda: torch.nn.Linear(8, 8), (torch.randn(4, 8),), {"name": "default"},
                                workload="w", device="cpu", min_run_time=0.01, rounds=3, **kw)
        assert rows[1]["status"] == "ok" and rows[1]["compile_s"] > 0

    def files():
        return [f for f in tmp_path.rglob("*") if f.is_file()]

    with utils.compiler.compile_cache(tmp_path):
        knob(cold_cache=True)
        assert files() == []  # its kernels went to an empty folder of its own, not to the shared cache
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)  # and the shared cache is back
        knob()
        assert files()  # without cold_cache, the knob compiles into (and from) the shared cache


def test_relative_to_divides_by_the_default_of_the_same_workload():
    rows = [{"workload": "a", "variant": "default", "speedup": 2.0, "status": "ok"},
            {"workload": "a", "variant": "k", "speedup": 3.0, "status": "ok"},
            {"workload": "b", "variant": "k", "speedup": 3.0, "status": "ok"},
            {"workload": "a", "variant": "s", "status": "skipped"}]
    assert [r["vs_default"] for r in tuning.relative_to(rows)] == [1.0, 1.5, None, None]


def test_autotune_summary_reads_inductors_lines():
    lines = ["AUTOTUNE mm(64x64, 64x64)", "strides: ...",
             "SingleProcess AUTOTUNE benchmarking takes 0.5000 seconds and 1.2500 seconds precompiling for 12 choices",
             "AUTOTUNE addmm(64x64, 64x64)",
             "SingleProcess AUTOTUNE benchmarking takes 0.2500 seconds and 0.0000 seconds precompiling for 3 choices"]
    assert tuning.autotune_summary(lines) == {"autotuned_ops": 2, "choices": 15, "benchmark_s": 2.0}


def test_tlparse_report_says_why_not(monkeypatch, tmp_path):
    monkeypatch.setattr(tuning.shutil, "which", lambda name: None)
    monkeypatch.setattr(tuning.sys, "executable", str(tmp_path / "python"))
    report, why = tuning.tlparse_report(tmp_path, tmp_path / "out")
    assert report is None and "pip install tlparse" in why


# --- the draft chapter -----------------------------------------------------------------------------

def test_draft_has_the_chapter_shape():
    from test_notebooks import check_draft_shape

    source, prose = check_draft_shape(NOTEBOOK, REPOSITORY_URL)
    assert 'utils.Run("06_tuning"' in source and "run.part(" in source and "run.about(" in source
    for api in ("set_logs", "TORCH_TRACE", "explain", "compile_times", "custom_op", "nonstrict_trace", "torch.cond",
                "capture_scalar_outputs", "fail_on_recompile", "mark_dynamic", "recompile_limit", "CompilerBisector",
                "cudagraph_mark_step_begin", "freezing", "coordinate_descent_tuning", "combo_kernels"):
        assert api in source + prose, f"the chapter does not teach {api}"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bfloat16: the GPU's dtype, tried on a CPU
def test_draft_runs_in_smoke_preset_on_cpu(tmp_path, monkeypatch, dtype):
    from test_notebooks import run_draft_smoke

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # inherited by the papermill kernel
    monkeypatch.setenv("BOOK_DTYPE", dtype)
    nb, text = run_draft_smoke(NOTEBOOK, tmp_path)
    assert f"in torch.{dtype}" in text
    assert "preset smoke" in text
    assert "graph breaks:" in text and "recompile_limit:" in text
    assert "coordinate_descent_tuning: skipped: tunes Triton kernels" in text, "the GPU-only knobs should say why"
    assert "freezing: ok" in text, "freezing runs on a CPU too"


@pytest.mark.slow
def test_tlparse_report_from_a_real_trace(tmp_path):
    import os
    import subprocess

    if tuning.tlparse_report(tmp_path / "none", tmp_path / "o")[1].startswith("tlparse is not installed"):
        pytest.skip("tlparse is not installed")
    script = "import torch\nf = torch.compile(lambda x: x.sin() + 1)\nf(torch.randn(4)); f(torch.randn(8))\n"
    env = {**os.environ, "TORCH_TRACE": str(tmp_path / "trace"), "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, timeout=600)
    report, why = tuning.tlparse_report(tmp_path / "trace", tmp_path / "report")
    assert report is not None and report.name == "index.html", why


# --- the tlparse report on the site: book/_ext/run_reports.py ---------------------------------------

def build_with_reports(repo):
    """Build a one-page Sphinx project in `repo` with the run_reports extension; the output folder."""
    (repo / "index.rst").write_text("Reports\n=======\n")
    return build_small_sphinx(repo, ["run_reports"])


def write_report(repo, gpu, name):
    report = repo / "results" / gpu / "tlparse" / name
    (report / "-_0_0_0").mkdir(parents=True)
    (report / "index.html").write_text(f"<html><body>{gpu} {name}</body></html>")
    (report / "-_0_0_0" / "inductor_output_code.html").write_text("<html>code</html>")


def test_a_runs_tlparse_report_is_copied_into_the_site(tmp_path):
    write_report(tmp_path, "h200", "tuning-tlparse")
    write_report(tmp_path, "cpu", "smoke-only")  # a CPU run's report is not a result of record
    out = build_with_reports(tmp_path)
    assert (out / "_static" / "tuning-tlparse" / "index.html").read_text() == \
        "<html><body>h200 tuning-tlparse</body></html>"
    assert (out / "_static" / "tuning-tlparse" / "-_0_0_0" / "inductor_output_code.html").exists()
    assert not (out / "_static" / "smoke-only").exists()


def test_two_gpus_reports_of_one_name_stop_the_build(tmp_path):
    from sphinx.errors import ExtensionError

    write_report(tmp_path, "h100-80gb-hbm3", "tuning-tlparse")
    write_report(tmp_path, "h200", "tuning-tlparse")
    with pytest.raises(ExtensionError, match="h100-80gb-hbm3.*h200.*keep one"):
        build_with_reports(tmp_path)


def test_the_chapter_links_to_the_report_where_its_run_writes_it():
    import json
    import re

    sys.path.insert(0, str(REPO / "book" / "_ext"))
    import run_reports

    nb = json.loads(NOTEBOOK.read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    prose = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    written = re.search(r'"results" / utils\.gpu_slug\(\) / "(\w+)" / "([\w-]+)"', code)
    assert written and written.group(1) == run_reports.REPORTS
    assert f'href="../_static/{written.group(2)}/index.html"' in prose
