"""Chapter 8's script: DDP and FSDP2 under torchrun on the CPU (gloo), eager and compiled.

utils/scale_out.py launches torchrun; every process it starts runs utils/scale_out_worker.py. One
torchrun run of 2 processes trains every configuration (module fixture); the tests read its rows.
The inductor cache is the session's (tests/conftest.py sets TORCHINDUCTOR_CACHE_DIR; the torchrun
subprocesses inherit it).
"""
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from utils import scale_out

LAUNCH_TIMEOUT_S = 600
NOTEBOOK = REPO / "notebooks" / "draft-08_scaling.ipynb"
LOSS_TOLERANCE = 1e-3  # fp32 on the CPU: compiled kernels reorder sums, nothing more


@pytest.fixture(scope="module")
def rows():
    """Every configuration at world size 2, gloo on the CPU, smoke preset: one torchrun run."""
    return scale_out.launch(2, preset="smoke", strategies="ddp,fsdp2", compiles="none,default,compiled_autograd",
                            device="cpu", timeout=LAUNCH_TIMEOUT_S)


def row_of(rows, strategy, compile_mode):
    found = [r for r in rows if r["strategy"] == strategy and r["compile"] == compile_mode]
    assert len(found) == 1, f"expected one {strategy}+{compile_mode} row, got {len(found)}"
    return found[0]


# --- the run ----------------------------------------------------------------------------------------

def test_a_row_per_configuration_with_both_ranks(rows):
    configs = [(r["strategy"], r["compile"]) for r in rows]
    assert configs == [("ddp", "none"), ("ddp", "default"), ("fsdp2", "none"), ("fsdp2", "default"),
                       ("ddp", "compiled_autograd")], "compiled autograd must run last (it changes global settings)"
    for row in rows:
        assert row["status"] == "ok", row["status"]
        assert row["world_size"] == 2 and row["backend"] == "gloo" and row["device"] == "cpu"
        assert [r["rank"] for r in row["per_rank"]] == [0, 1]
        assert all(r["tok_s"] > 0 and r["median_ms"] > 0 for r in row["per_rank"])
        assert row["tok_s_total"] == pytest.approx(sum(r["tok_s"] for r in row["per_rank"]))
        assert row["tok_s_per_gpu"] == pytest.approx(row["tok_s_total"] / 2)
        # tokens/s is what the slowest-rank step time says, within the spread of the ranks
        tokens = row["batch_per_rank"] * row["seq_len"]
        assert tokens / (row["median_ms"] / 1e3) <= row["tok_s_per_gpu"] * 1.0001
        assert row["steps"] == len(row["per_rank"][0]["losses"])
        assert row["provenance"]["torch"] == torch.__version__ and row["provenance"]["preset"] == "smoke"


def test_compiled_losses_equal_eager(rows):
    """Same seed, same batches, same steps: compiled training follows eager, step by step, on every rank."""
    for strategy, compile_mode in [("ddp", "default"), ("ddp", "compiled_autograd"), ("fsdp2", "default")]:
        eager, compiled = row_of(rows, strategy, "none"), row_of(rows, strategy, compile_mode)
        for e, c in zip(eager["per_rank"], compiled["per_rank"]):
            gap = max(abs(a - b) for a, b in zip(e["losses"], c["losses"]))
            assert gap < LOSS_TOLERANCE, f"{strategy}+{compile_mode} rank {e['rank']}: loss differs by {gap:.2e}"


def test_ddp_and_fsdp2_train_the_same_model(rows):
    """Both average the gradients over the ranks: the same losses, and the ranks' data differ."""
    ddp, fsdp = row_of(rows, "ddp", "none"), row_of(rows, "fsdp2", "none")
    for d, f in zip(ddp["per_rank"], fsdp["per_rank"]):
        assert max(abs(a - b) for a, b in zip(d["losses"], f["losses"])) < LOSS_TOLERANCE
    rank0, rank1 = ddp["per_rank"]
    assert rank0["losses"][0] != rank1["losses"][0], "both ranks trained on the same batch"
    assert rank0["losses"][-1] < rank0["losses"][0] + 0.5  # it trains, it does not blow up


def test_eager_compiles_nothing(rows):
    for strategy in ("ddp", "fsdp2"):
        row = row_of(rows, strategy, "none")
        assert row["graphs"] == row["aot_graphs"] == row["graph_breaks"] == 0
        assert row["ddp_buckets"] is None and row["compile_s"] == 0.0 and row["speedup"] == pytest.approx(1.0)


def test_ddp_optimizer_splits_the_graph_at_buckets(rows):
    """The smoke GPT (1.7 MiB) with 1 MiB buckets: one Dynamo graph, split by DDPOptimizer into >= 2 compiled pieces."""
    row = row_of(rows, "ddp", "default")
    assert row["graphs"] >= 1
    assert row["ddp_buckets"] is not None and row["ddp_buckets"] >= 2, row["ddp_buckets"]
    assert row["aot_graphs"] >= row["ddp_buckets"], "each bucket's subgraph goes through AOTAutograd on its own"
    assert row["optimize_ddp"] == "ddp_optimizer" and row["bucket_cap_mb"] == 1.0
    assert row["graph_breaks"] >= len(row["graph_break_reasons"])  # DDP's own bookkeeping in its forward
    assert row["compile_s"] > 0 and row["speedup"] > 0


def test_compiled_autograd_captures_the_backward_without_splitting(rows):
    row = row_of(rows, "ddp", "compiled_autograd")
    assert row["optimize_ddp"] == "python_reducer"
    assert row["compiled_autograd_captures"] >= 1
    assert row["ddp_buckets"] is None, "with the Python reducer DDPOptimizer must not split"
    assert row["graphs"] >= 2, "the forward graph and the backward graph compiled autograd captured"
    assert any("backward" in reason for reason in row["graph_break_reasons"]), row["graph_break_reasons"]


def test_fsdp2_compiles_each_block_without_breaks(rows):
    row = row_of(rows, "fsdp2", "default")
    assert row["graphs"] >= 1 and row["graph_breaks"] == 0  # fullgraph=True per block
    assert row["ddp_buckets"] is None and row["bucket_cap_mb"] is None


def test_speedup_is_eager_median_over_compiled_median(rows):
    for strategy, compile_mode in [("ddp", "default"), ("ddp", "compiled_autograd"), ("fsdp2", "default")]:
        eager, compiled = row_of(rows, strategy, "none"), row_of(rows, strategy, compile_mode)
        assert compiled["speedup"] == pytest.approx(eager["median_ms"] / compiled["median_ms"])


def test_scaling_efficiency_against_one_process():
    def row(n, tok_s, strategy="ddp"):
        return {"status": "ok", "world_size": n, "strategy": strategy, "compile": "none", "device": "cuda",
                "tok_s_per_gpu": tok_s}
    rows = scale_out.scaling_efficiency([row(1, 100.0), row(2, 90.0), row(4, 75.0), row(2, 50.0, "fsdp2")])
    assert [r["scaling_efficiency"] for r in rows] == [1.0, 0.9, 0.75, None]


# --- clear errors on bad input ---------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(preset="huge"), "Unknown preset 'huge'"),
    (dict(strategies="ddp,zero3"), "Unknown strategy 'zero3'"),
    (dict(compiles="max-autotune"), "Unknown compile mode 'max-autotune'"),
    (dict(strategies="fsdp2", compiles="compiled_autograd"), "ddp strategy only"),
    (dict(device="tpu"), "Unknown device 'tpu'"),
])
def test_launch_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        scale_out.launch(2, **kwargs)


def test_launch_rejects_zero_processes():
    with pytest.raises(ValueError, match="positive integer"):
        scale_out.launch(0)


def test_more_processes_than_gpus_is_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="2 processes requested but only 1 GPU"):
        scale_out.launch(2, device="cuda")


def test_cuda_without_a_gpu_is_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no GPU is visible"):
        scale_out.launch(1, device="cuda")


def test_fsdp2_on_a_torch_without_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp", None)  # `from torch.distributed.fsdp import` fails
    with pytest.raises(RuntimeError, match=r"FSDP2 .* needs torch >= 2.6"):
        scale_out.launch(2, strategies="fsdp2")
    scale_out.configurations("ddp", "none")  # DDP alone still works


def test_bucket_cap_below_ddp_optimizers_first_bucket():
    with pytest.raises(ValueError, match="at least 1"):
        scale_out.sizes_of("smoke", bucket_cap_mb=0.5)


@pytest.mark.parametrize("args, message", [
    (["--strategy", "bogus"], "Unknown strategy 'bogus'"),
    (["--preset", "huge"], "invalid choice: 'huge'"),
    (["--compile", "none,fast"], "Unknown compile mode 'fast'"),
])
def test_command_line_rejects_bad_input(args, message, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "utils.scale_out_worker", *args, "--out", str(tmp_path / "r.jsonl")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("module", ["utils.scale_out_worker", "utils.scale_out"])  # the worker, or its old name
def test_command_line_needs_torchrun(module, tmp_path):
    proc = subprocess.run([sys.executable, "-m", module, "--out", str(tmp_path / "r.jsonl")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "runs under torchrun" in proc.stderr


def test_a_failed_run_raises_with_the_end_of_its_output():
    with pytest.raises(scale_out.LaunchError) as error:
        scale_out.launch(1, device="cpu", extra=("--steps", "0"), timeout=LAUNCH_TIMEOUT_S)
    message = str(error.value)
    assert "torchrun exited" in message and "--steps 0" in message
    assert "at least 1" in message, "the worker's own error message is not in the LaunchError"


def test_a_run_past_its_timeout_is_stopped():
    with pytest.raises(scale_out.LaunchError, match="timed out after 3 s"):
        scale_out.launch(1, device="cpu", timeout=3)


# --- the draft chapter -----------------------------------------------------------------------------

@pytest.mark.slow
def test_draft_notebook_runs_in_smoke_preset_on_cpu(tmp_path, monkeypatch):
    from test_notebooks import errors, glue_stored, glue_used, load, output_text, unexecuted
    from utils.run_book import execute

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # inherited by the papermill kernel and its torchruns
    executed = execute(NOTEBOOK, preset="smoke", out_dir=tmp_path, timeout=LAUNCH_TIMEOUT_S * 2)
    nb = load(executed)
    assert not unexecuted(nb), f"code cells that did not run: {unexecuted(nb)}"
    assert not errors(nb), f"error outputs: {errors(nb)}"
    text = "\n".join(output_text(o) for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))
    assert "skipped: no GPU" in text, "the GPU scaling runs should say why they were skipped"
    assert "gpt ddp x2" in text and "gpt fsdp2 x2" in text, "the gloo runs' table is missing"
    used, glued = glue_used(nb), glue_stored(nb)
    assert used and used <= glued, f"the prose uses values no cell glued: {sorted(used - glued)}"
