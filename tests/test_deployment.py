"""Chapter 7: the cold-start worker in fresh processes, and the FastAPI server on the CPU (start, good and bad
requests, restart). Tiny models (the smoke preset); the session's warm inductor cache (tests/conftest.py)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from utils import cold_start, serve_app, serving

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


def test_worker_command_line_rejects_bad_input():
    for args, message in ((["--model", "vit", "--path", "eager"], "invalid choice: 'vit'"),
                          (["--model", "lm", "--path", "aoti"], "--path aoti needs --artifact")):
        proc = subprocess.run([sys.executable, "-m", "utils.cold_start", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-500:]


# --- the server ----------------------------------------------------------------------------------------

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
    assert "bad requests: 4 refused with a 4xx" in text and "recompiles under load: 0" in text
