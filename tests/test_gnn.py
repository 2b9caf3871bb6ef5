"""Chapter 4's helpers (utils/gnn.py): Cora offline, clear errors, compiled steps equal to eager, sampling."""
import os
import shutil
import stat
import warnings

import pytest
import torch

from conftest import REPO

warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=FutureWarning)
pytest.importorskip("torch_geometric")
pytest.importorskip("scipy")  # Planetoid reads the raw files with scipy

from utils import gnn  # noqa: E402

SHARED_PLANETOID = REPO.parent / "shared" / "data" / "planetoid"
needs_cora = pytest.mark.skipif(not (SHARED_PLANETOID / "Cora" / "raw").is_dir(),
                                reason=f"no Cora raw files at {SHARED_PLANETOID}")


def copy_cora(dst, writable=True):
    """A copy of the shared Cora raw files under dst (read-only when asked)."""
    shutil.copytree(SHARED_PLANETOID / "Cora" / "raw", dst / "Cora" / "raw")
    if not writable:
        for path in [dst / "Cora" / "raw", dst / "Cora", dst]:
            for f in ([path] + list(path.iterdir()) if path.is_dir() else [path]):
                f.chmod(f.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return dst


def tiny_graph(num_nodes=12, num_edges=40, features=8, classes=3, seed=0):
    data = gnn.synthetic_graph(num_nodes, num_edges, features, num_classes=classes, seed=seed)
    data.train_idx = torch.arange(0, num_nodes, 2)
    data.test_idx = torch.arange(1, num_nodes, 2)
    return data


# --- Cora -----------------------------------------------------------------------------------------

@needs_cora
def test_cora_loads_from_a_copy_with_the_right_sizes(tmp_path):
    data = gnn.load_cora(copy_cora(tmp_path), download=False)
    assert (data.num_nodes, data.num_edges, data.num_features, data.num_classes) == (2708, 10556, 1433, 7)
    assert (data.train_idx.numel(), data.val_idx.numel(), data.test_idx.numel()) == (140, 500, 1000)
    assert torch.equal(data.train_idx, data.train_mask.nonzero().view(-1))
    assert torch.allclose(data.x.sum(1)[data.x.sum(1) > 0], torch.ones(1))  # row-normalised features
    assert (tmp_path / "Cora" / "processed").is_dir()


@needs_cora
def test_cora_from_a_read_only_folder_is_copied_not_written(tmp_path):
    root = copy_cora(tmp_path / "ro", writable=False)
    try:
        data = gnn.load_cora(root, download=False)
        assert data.num_nodes == 2708
        assert not (root / "Cora" / "processed").exists()
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


@needs_cora
def test_planetoid_root_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANETOID_ROOT", str(copy_cora(tmp_path)))
    assert gnn.planetoid_root() == tmp_path
    assert gnn.load_cora(download=False).num_nodes == 2708
    assert gnn.planetoid_root(tmp_path / "other") == tmp_path / "other"


def test_missing_cora_offline_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="PLANETOID_ROOT"):
        gnn.load_cora(tmp_path, download=False)
    monkeypatch.setattr(gnn, "_online", lambda *a, **k: False)  # as on a machine with no internet
    with pytest.raises(FileNotFoundError, match=r"ind\.cora\.x"):
        gnn.load_cora(tmp_path / "empty", download=True)
    assert not (tmp_path / "empty").exists(), "nothing may be created when nothing can be downloaded"


def test_a_failed_download_names_the_cause(tmp_path, monkeypatch):
    import torch_geometric.datasets

    def refuse(*args, **kwargs):
        raise OSError("connection refused")

    monkeypatch.setattr(gnn, "_online", lambda *a, **k: True)
    monkeypatch.setattr(torch_geometric.datasets, "Planetoid", refuse)
    with pytest.raises(RuntimeError, match="connection refused"):
        gnn.load_cora(tmp_path, download=True)


# --- models and steps -----------------------------------------------------------------------------

def test_make_gnn_builds_the_three_models_and_refuses_others():
    for kind in gnn.MODELS:
        model = gnn.make_gnn(kind, 8, 16, 2, 3)
        assert type(model).__name__ == kind
        assert model(torch.randn(5, 8), torch.tensor([[0, 1, 2], [1, 2, 3]])).shape == (5, 3)
    with pytest.raises(ValueError, match="GraphSAGE"):
        gnn.make_gnn("GAT", 8, 16, 2)


def eager_and_compiled_losses(whole_step, steps=3):
    """Losses of `steps` training steps, eager and compiled, from the same initial weights."""
    data = tiny_graph()
    inputs = (data.x, data.edge_index, data.y, data.train_idx)
    losses = []
    for compiled in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = gnn.attach_adam(gnn.make_gnn("GraphSAGE", 8, 16, 2, 3))
        if not compiled:
            step = gnn.TrainStep(model)
        elif whole_step:
            step = torch.compile(gnn.TrainStep(model))
        else:
            step = gnn.TrainStep(torch.compile(model, fullgraph=True, dynamic=False))
        losses.append(torch.stack([gnn.run_whole_step(step, inputs) for _ in range(steps)]))
    return losses


def test_compiled_model_step_gives_eager_losses():
    eager, compiled = eager_and_compiled_losses(whole_step=False)
    assert eager[0] > eager[-1], "the steps do not train"
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


def test_compiled_whole_step_gives_eager_losses():
    eager, compiled = eager_and_compiled_losses(whole_step=True)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


def test_fit_trains_and_counts_graphs():
    data = tiny_graph(num_nodes=40, num_edges=200)
    make = lambda: gnn.make_gnn("GraphSAGE", 8, 16, 2, 3)  # noqa: E731
    eager = gnn.fit(make, data, {"compile": False}, epochs=5)
    assert eager["graphs"] == 0 and 0.0 <= eager["test_acc"] <= 1.0
    compiled = gnn.fit(make, data, {"backend": "eager", "fullgraph": True}, epochs=5)
    assert compiled["graphs"] == 1
    assert compiled["final_loss"] == pytest.approx(eager["final_loss"], rel=1e-5)
    summary = gnn.fit_seeds(make, data, {"compile": False}, epochs=2, seeds=[0, 1])
    assert summary["fit_status"] == "ok" and len(summary["test_accs"]) == 2


def test_fit_seeds_reports_a_failure_instead_of_raising():
    data = tiny_graph()
    out = gnn.fit_seeds(lambda: gnn.make_gnn("GraphSAGE", 8, 16, 2, 3), data, {"backend": "no-such-backend"},
                        epochs=1, seeds=[0])
    assert out["test_acc"] is None and out["fit_status"].startswith("failed")


def test_gcn_breaks_inside_and_is_whole_when_normalised_beforehand():
    import torch_geometric.transforms as T

    data = tiny_graph(num_nodes=20, num_edges=60)
    graphs, breaks, reasons = gnn.explain_counts(gnn.make_gnn("GCN", 8, 8, 2), data.x, data.edge_index)
    assert breaks >= 1 and graphs == breaks + 1 and reasons
    normed = T.GCNNorm()(data.clone())
    graphs, breaks, _ = gnn.explain_counts(gnn.make_gnn("GCN", 8, 8, 2, normalize=False),
                                           normed.x, normed.edge_index, normed.edge_weight)
    assert (graphs, breaks) == (1, 0)


def test_recount_model_breaks_counts_the_model_not_the_backward():
    data = tiny_graph()
    rows = [{"variant": "eager", "status": "ok", "graph_breaks": 0},
            {"variant": "default", "status": "ok", "graph_breaks": 1},
            {"variant": "reduce-overhead", "status": "skipped: no GPU"}]
    gnn.recount_model_breaks(rows, lambda: gnn.make_gnn("GraphSAGE", 8, 8, 2), (data.x, data.edge_index))
    assert [r.get("graph_breaks") for r in rows] == [0, 0, None]


# --- synthetic graphs and sampling ----------------------------------------------------------------

def test_synthetic_graph_sizes_and_determinism():
    g = gnn.synthetic_graph(1000, 5000, 16, num_classes=4, seed=3)
    assert g.x.shape == (1000, 16) and g.edge_index.shape == (2, 5000) and g.y.shape == (1000,)
    assert int(g.edge_index.max()) < 1000 and int(g.y.max()) < 4
    assert torch.equal(g.edge_index, gnn.synthetic_graph(1000, 5000, 16, num_classes=4, seed=3).edge_index)


def test_torch_sampler_samples_real_edges_without_replacement():
    g = gnn.synthetic_graph(500, 5000, 4, seed=1)
    sampler = gnn.TorchNeighborSampler(g, [3, 2], seed=0)
    seeds = torch.arange(10, 42)
    batch = sampler.sample(seeds)
    assert batch.batch_size == 32 and torch.equal(batch.n_id[:32], seeds)
    assert batch.n_id.unique().numel() == batch.n_id.numel()
    assert torch.equal(batch.x, g.x[batch.n_id]) and torch.equal(batch.y, g.y[batch.n_id])
    n = g.num_nodes
    real = set((g.edge_index[0] * n + g.edge_index[1]).tolist())
    src, dst = batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]
    assert set((src * n + dst).tolist()) <= real
    # hop 1: each seed keeps at most 3 in-edges, all of them when it has fewer
    in_degree = torch.bincount(g.edge_index[1], minlength=n)
    first_hop = batch.edge_index[:, :int(torch.minimum(in_degree[seeds], torch.tensor(3)).sum())]
    counts = torch.bincount(first_hop[1], minlength=32)
    assert torch.equal(counts, torch.minimum(in_degree[seeds], torch.tensor(3)))
    assert (sampler.local == -1).all(), "the sampler must reset its id map"


def test_neighbor_batches_vary_in_size():
    g = gnn.synthetic_graph(2000, 20000, 4)
    batches, name = gnn.neighbor_batches(g, [4, 4], batch_size=16, num_batches=4)
    assert len(batches) == 4 and name
    assert all(b.batch_size == 16 for b in batches)
    assert len({(b.num_nodes, b.edge_index.size(1)) for b in batches}) > 1


def test_minibatch_sweep_counts_recompiles():
    g = gnn.synthetic_graph(300, 3000, 4, num_classes=3)
    batches, _ = gnn.neighbor_batches(g, [3, 3], batch_size=8, num_batches=4)
    make = lambda: gnn.make_gnn("GraphSAGE", 4, 8, 2, 3)  # noqa: E731
    static = gnn.minibatch_sweep(make, batches, {"backend": "eager", "dynamic": False}, rounds=3, min_run_time=0.05)
    dynamic = gnn.minibatch_sweep(make, batches, {"backend": "eager", "dynamic": True}, rounds=3, min_run_time=0.05)
    shapes = len({(b.num_nodes, b.edge_index.size(1)) for b in batches})
    assert static["graphs"] == shapes and static["recompiles"] == shapes - 1
    assert static["compiled_at"][0] == 0 and len(static["compiled_at"]) == shapes
    assert dynamic["graphs"] == 1 and dynamic["compiled_at"] == [0]
    assert len(static["first_pass_s"]) == 4 and static["median_ms"] > 0
    # the compiled passes were timed in rounds alternating with eager ones: a ratio per round
    assert static["rounds"] == 3 and static["speedup_lo"] <= static["speedup"] <= static["speedup_hi"]
    assert static["eager_ms"] > 0
    eager = gnn.minibatch_sweep(make, batches, {"compile": False}, rounds=3, min_run_time=0.05)
    assert eager["graphs"] == 0 and eager["speedup"] == 1.0 and eager["compiled_at"] == []


def test_compiled_ratio_times_two_models_in_rounds():
    data = tiny_graph()
    make = lambda: gnn.make_gnn("GraphSAGE", 8, 8, 2)  # noqa: E731
    out = gnn.compiled_ratio(make, (data.x, data.edge_index), make, (data.x, data.edge_index),
                             run=lambda m, args: m(*args), config={"backend": "eager"}, rounds=3, min_run_time=0.05)
    assert out["rounds"] == 3 and out["ratio_lo"] <= out["ratio"] <= out["ratio_hi"]
    assert out["a_ms"] > 0 and out["b_ms"] > 0



def test_gpu_measures_are_none_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert gnn.kernels_per_call(lambda: None) is None
    assert gnn.eager_op_ms("cpu") is None
    data = tiny_graph()
    assert gnn.step_gpu_ms(lambda: gnn.make_gnn("GraphSAGE", 8, 8, 2, 3),
                           (data.x, data.edge_index, data.y, data.train_idx)) is None


def test_whole_step_breaks_where_the_chapter_says():
    """zero_grad is never traced, backward is not traced, Adam's step breaks around its update: three graphs."""
    from torch._dynamo.utils import counters

    data = tiny_graph()
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(gnn.TrainStep(gnn.attach_adam(gnn.make_gnn("GraphSAGE", 8, 16, 2, 3))), backend="eager")
    step(data.x, data.edge_index, data.y, data.train_idx)
    reasons = "\n".join(counters["graph_break"])
    assert "Optimizer.zero_grad" in reasons and "backward" in reasons and "graph_break()" in reasons, reasons
    assert counters["stats"]["unique_graphs"] == 3


ONE_GRAPH_EXERCISE = """
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch._dynamo
import torch.nn.functional as F
from utils import gnn

data = gnn.synthetic_graph(12, 40, 8, num_classes=3)
idx = torch.arange(0, 12, 2)
model = gnn.make_gnn("GraphSAGE", 8, 16, 2, 3)
params = list(model.parameters())

def sgd_step(x, edge_index, y, idx, lr=0.01):
    for p in params:
        p.grad = None
    loss = F.cross_entropy(model(x, edge_index)[idx], y[idx])
    loss.backward()
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-lr)
    return loss.detach()

counts = {}
for trace in (False, True):
    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=trace):
        explanation = torch._dynamo.explain(sgd_step)(data.x, data.edge_index, data.y, idx)
    counts[str(trace)] = [explanation.graph_count, explanation.graph_break_count]
print(json.dumps(counts))
"""


def test_one_dynamo_graph_needs_traced_backward_and_no_torch_optim():
    """The chapter's exercise: an SGD step by hand is two graphs, one with trace_autograd_ops.

    In a process of its own: with torch 2.14, once such a step was traced with trace_autograd_ops, a later
    compile of a step with torch.optim's Adam failed in the same process ("not in cell_and_freevars").
    """
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", ONE_GRAPH_EXERCISE], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"False": [2, 1], "True": [1, 0]}


def test_step_in_one_graph_runs_steps_as_they_are_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    data = tiny_graph()
    inputs = (data.x, data.edge_index, data.y, data.train_idx)
    losses = []
    for run in (gnn.run_whole_step, gnn.run_step_in_one_graph):
        torch._dynamo.reset()
        torch.manual_seed(0)
        step = torch.compile(gnn.TrainStep(gnn.attach_adam(gnn.make_gnn("GraphSAGE", 8, 16, 2, 3))), backend="eager")
        losses.append(torch.stack([run(step, inputs) for _ in range(3)]))
    torch.testing.assert_close(losses[1], losses[0])
    assert not gnn._REPLAYS, "a CUDA graph was recorded without a GPU"


def test_compare_in_one_graph_skips_the_graph_without_a_gpu():
    data = tiny_graph()
    inputs = (data.x, data.edge_index, data.y, data.train_idx)
    rows = gnn.compare_in_one_graph(lambda: gnn.TrainStep(gnn.attach_adam(gnn.make_gnn("GraphSAGE", 8, 8, 2, 3))),
                                    inputs, workload="tiny", device="cpu", min_run_time=0.02, extra={"compiled": "x"})
    assert [r["variant"] for r in rows] == ["eager", "default"]
    assert rows[0]["status"] == "ok" and rows[0]["median_ms"] > 0
    assert rows[1]["status"] == "skipped" and rows[1]["reason"] == gnn.NEEDS_GPU and rows[1]["compiled"] == "x"
    fit = gnn.fit_seeds_in_one_graph(lambda: gnn.make_gnn("GraphSAGE", 8, 8, 2, 3), data, epochs=5, seeds=[0])
    assert fit == {"test_acc": None, "fit_status": f"skipped: {gnn.NEEDS_GPU}"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_step_in_one_graph_trains_as_the_compiled_step_on_a_gpu():
    """The replays are whole training steps: the same losses as the compiled step, step for step."""
    data = tiny_graph(num_nodes=40, num_edges=200).to("cuda")
    inputs = (data.x, data.edge_index, data.y, data.train_idx)
    losses = []
    for run in (gnn.run_whole_step, gnn.run_step_in_one_graph):
        torch._dynamo.reset()
        torch.manual_seed(0)
        step = torch.compile(gnn.TrainStep(gnn.attach_adam(gnn.make_gnn("GraphSAGE", 8, 16, 2, 3).cuda())))
        losses.append(torch.stack([run(step, inputs).clone() for _ in range(8)]))
    # the first call of the graphed step compiles, warms up (three steps) and captures; then each call is one step
    compiled, graphed = losses
    torch.testing.assert_close(graphed[0], compiled[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(graphed[1:4], compiled[4:7], rtol=1e-4, atol=1e-5)
    fit = gnn.fit_seeds_in_one_graph(lambda: gnn.make_gnn("GraphSAGE", 8, 16, 2, 3).cuda(), data, epochs=10,
                                     seeds=[0])
    assert fit["fit_status"] == "ok" and 0.0 <= fit["test_acc"] <= 1.0


def test_capturable_adam_is_asked_for_by_name():
    model = gnn.attach_adam(gnn.make_gnn("GraphSAGE", 8, 8, 2), capturable=True)
    assert model.optimizer.param_groups[0]["capturable"] is True
    assert gnn.attach_adam(gnn.make_gnn("GraphSAGE", 8, 8, 2)).optimizer.param_groups[0]["capturable"] is False


def test_planetoid_root_falls_back_to_the_shared_copy(monkeypatch):
    monkeypatch.delenv("PLANETOID_ROOT", raising=False)
    root = gnn.planetoid_root()
    if gnn.missing_cora_files(gnn.REPO_ROOT / "data" / "planetoid") and not gnn.missing_cora_files(gnn.SHARED_ROOT):
        assert root == gnn.SHARED_ROOT
    else:
        assert root == gnn.REPO_ROOT / "data" / "planetoid"


def test_gnn_panel_runs_a_measurement_on_click():
    import matplotlib
    matplotlib.use("Agg")
    graph = gnn.synthetic_graph(num_nodes=200, num_edges=1000, num_features=8)
    panel = gnn.gnn_panel(graph, "cpu", hiddens=(8,), num_layers=2, min_run_time=0.05)
    buttons = [c for box in panel.children for c in getattr(box, "children", ()) if getattr(c, "description", "") == "Run"]
    assert len(buttons) == 1
    buttons[0].click()
    assert [r["variant"] for r in panel.rows] == ["eager", "default"]
    assert all(r["status"] == "ok" for r in panel.rows), panel.rows
