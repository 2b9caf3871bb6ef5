"""Chapter 4's helpers: Cora offline, PyG models, training steps, synthetic graphs, a neighbour sampler, a panel.

Works with torch 2.11 to 2.14 and torch_geometric 2.8. Nothing here downloads unless asked to.
"""
import contextlib
import io
import os
import shutil
import socket
import stat
import statistics
import tempfile
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .compare import compare, compile_kwargs, cudagraph_step_begin, recount_model_breaks  # noqa: F401 (re-exported for chapter 4)
from .env import REPO_ROOT

CORA_RAW = [f"ind.cora.{name}" for name in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")]
PLANETOID_HOST = ("github.com", 443)  # Planetoid downloads from github.com/kimiyoung/planetoid
MODELS = ("GCN", "GraphSAGE", "GIN")


# --- Cora, offline first --------------------------------------------------------------------------

SHARED_ROOT = REPO_ROOT.parent / "shared" / "data" / "planetoid"  # a copy laid beside the checkout (tests, CI)


def planetoid_root(root=None):
    """The Planetoid folder: `root`, else $PLANETOID_ROOT, else data/planetoid in the repository, else a shared copy beside it (chapter 4)."""
    if root or os.environ.get("PLANETOID_ROOT"):
        return Path(root or os.environ["PLANETOID_ROOT"])
    local = REPO_ROOT / "data" / "planetoid"
    if missing_cora_files(local) and not missing_cora_files(SHARED_ROOT):
        return SHARED_ROOT
    return local


def missing_cora_files(root):
    """Names of Cora's raw files absent from <root>/Cora/raw (chapter 4)."""
    raw = Path(root) / "Cora" / "raw"
    return [name for name in CORA_RAW if not (raw / name).is_file()]


def _online(host=PLANETOID_HOST, timeout=5.0):
    """Whether a TCP connection to Planetoid's download host opens within `timeout` seconds (chapter 4)."""
    try:
        socket.create_connection(host, timeout=timeout).close()
        return True
    except OSError:
        return False


def _writable_copy(root):
    """`root` if PyG can write its processed/ folder there, else a copy of <root>/Cora in a temporary folder (chapter 4)."""
    cora = Path(root) / "Cora"
    target = cora / "processed" if (cora / "processed").exists() else cora
    # os.access alone says yes to root even without write bits: honour the bits too
    if os.access(target, os.W_OK) and target.stat().st_mode & stat.S_IWUSR:
        return Path(root)
    copy = Path(tempfile.mkdtemp(prefix="planetoid-"))  # silently: the page shows no machine paths
    shutil.copytree(cora, copy / "Cora")
    for path in [copy, *copy.rglob("*")]:  # a copy of a read-only tree is read-only too
        path.chmod(path.stat().st_mode | 0o200)
    return copy


def _quiet(fn, *args, **kwargs):
    """fn(*args, **kwargs) without PyG's "Processing... Done!" on stderr (chapter 4)."""
    with contextlib.redirect_stderr(io.StringIO()):
        return fn(*args, **kwargs)


def load_cora(root=None, download=True):
    """Cora (public split) with row-normalised features and train/val/test index tensors; a clear error offline (chapter 4).

    Reads <root>/Cora/raw/ind.cora.{x,tx,allx,y,ty,ally,graph,test.index}; a read-only root is copied to a
    temporary folder first (PyG writes processed/ beside raw/). Missing files are downloaded by PyG when
    `download` is true and the download host answers; otherwise FileNotFoundError says what to do.
    """
    import torch_geometric.transforms as T
    from torch_geometric.datasets import Planetoid

    root = planetoid_root(root)
    missing = missing_cora_files(root)
    if missing:
        hint = (f"Cora's raw files are not in {root / 'Cora' / 'raw'} (missing: {', '.join(missing)}). "
                "Put the eight Planetoid files ind.cora.* there (from github.com/kimiyoung/planetoid, data/), "
                "or point the environment variable PLANETOID_ROOT (or DATA_ROOT in the presets cell) at a folder "
                "holding Cora/raw/ind.cora.*")
        if not download:
            raise FileNotFoundError(hint + ".")
        if not _online():
            raise FileNotFoundError(hint + f", or run where {PLANETOID_HOST[0]} can be reached so PyG can "
                                    "download them.")
        root.mkdir(parents=True, exist_ok=True)
        try:
            dataset = _quiet(Planetoid, str(root), "Cora", transform=T.NormalizeFeatures())
        except Exception as error:  # a failed download: say what happened, not where in PyG
            raise RuntimeError(f"Downloading Cora into {root} failed ({type(error).__name__}: {error}). "
                               + hint + ".") from None
    else:
        dataset = _quiet(Planetoid, str(_writable_copy(root)), "Cora", transform=T.NormalizeFeatures())
    data = dataset[0]
    for split in ("train", "val", "test"):  # index tensors: boolean masks in a compiled step mean nonzero()
        data[f"{split}_idx"] = data[f"{split}_mask"].nonzero().view(-1)
    data.num_classes = dataset.num_classes
    return data


# --- models and training steps --------------------------------------------------------------------

def make_gnn(kind, in_channels, hidden_channels, num_layers, out_channels=None, dropout=0.0, **kwargs):
    """PyG's GCN, GraphSAGE or GIN (torch_geometric.nn.models), extra kwargs passed to its conv layers (chapter 4)."""
    from torch_geometric.nn import models

    if kind not in MODELS:
        raise ValueError(f"Unknown model {kind!r}: choose one of {', '.join(MODELS)}.")
    return getattr(models, kind)(in_channels, hidden_channels, num_layers, out_channels,
                                 dropout=dropout, **kwargs)


def attach_adam(model, lr=0.01, weight_decay=5e-4, capturable=False):
    """Give model an Adam optimizer at `model.optimizer` (a compiled model forwards the attribute) (chapter 4).

    `capturable=True` keeps Adam's step count on the GPU, which capturing the step into a CUDA graph needs.
    """
    model.optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay, capturable=capturable)
    return model


def train_step(model, x, edge_index, y, idx):
    """One step: forward, cross-entropy on the nodes `idx`, backward, optimizer step; returns the loss (chapter 4)."""
    optimizer = model.optimizer
    optimizer.zero_grad(set_to_none=True)
    out = model(x, edge_index)
    loss = F.cross_entropy(out[idx], y[idx])
    loss.backward()
    optimizer.step()
    return loss.detach()


class TrainStep(nn.Module):
    """The whole training step as a module, so torch.compile captures forward, backward and optimizer (chapter 4)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, edge_index, y, idx):
        return train_step(self.model, x, edge_index, y, idx)


def run_model_step(model, inputs):
    """compare()'s `run` for a compiled model inside an eager training step (chapter 4)."""
    cudagraph_step_begin()
    return train_step(model, *inputs)


def run_whole_step(step, inputs):
    """compare()'s `run` for a TrainStep, compiled as a whole or not (chapter 4)."""
    cudagraph_step_begin()
    return step(*inputs)


def run_forward_backward(model, inputs):
    """compare()'s `run` for PyG's benchmark: forward on (x, edge_index[, ...]), backward of a fixed gradient (chapter 4).

    Gradients are reset to None first, so no step accumulates into a CUDA graph's recycled output.
    """
    cudagraph_step_begin()
    *args, grad = inputs
    model.zero_grad(set_to_none=True)
    for arg in args:
        if arg.is_floating_point() and arg.requires_grad:
            arg.grad = None
    out = model(*args)
    out.backward(grad)
    return out.detach()


@torch.no_grad()
def accuracy(model, data, idx):
    """Fraction of the nodes `idx` whose predicted class is right, with the model in eval mode (chapter 4)."""
    was_training = model.training
    model.eval()
    pred = model(data.x, data.edge_index).argmax(dim=-1)
    model.train(was_training)
    return (pred[idx] == data.y[idx]).float().mean().item()


def fit(make_model, data, config, epochs, whole_step=False, seed=0):
    """Train a fresh model for `epochs` full-batch steps under a compare() config; test accuracy and graphs compiled (chapter 4).

    config is {"compile": False} for eager or torch.compile settings as compare() takes them; with
    whole_step the TrainStep is compiled, else only the model. Accuracy is read with the eager model.
    """
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(seed)
    model = attach_adam(make_model())
    if config.get("compile") is False:
        step = TrainStep(model)
    elif whole_step:
        step = torch.compile(TrainStep(model), **compile_kwargs(config))
    else:
        step = TrainStep(torch.compile(model, **compile_kwargs(config)))
    model.train()
    inputs = (data.x, data.edge_index, data.y, data.train_idx)
    for _ in range(epochs):
        loss = run_whole_step(step, inputs)
    return {"test_acc": accuracy(model, data, data.test_idx), "final_loss": float(loss),
            "graphs": counters["stats"]["unique_graphs"]}


def fit_seeds(make_model, data, config, epochs, seeds, whole_step=False):
    """fit() for each seed: mean test accuracy, the accuracies, graphs compiled; a failure is reported, not raised (chapter 4)."""
    try:
        runs = [fit(make_model, data, config, epochs, whole_step=whole_step, seed=seed) for seed in seeds]
    except Exception as error:  # a compile error is a result
        return {"test_acc": None, "fit_status": f"failed: {type(error).__name__}: {str(error)[:200]}"}
    accs = [r["test_acc"] for r in runs]
    return {"test_acc": sum(accs) / len(accs), "test_accs": accs, "epochs": epochs,
            "train_graphs": runs[0]["graphs"], "fit_status": "ok"}


def explain_counts(fn, *args):
    """(graphs, graph breaks, first line of each break reason) that torch._dynamo.explain finds in fn(*args) (chapter 4)."""
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    reasons = [r.reason.strip().splitlines()[0] for r in explanation.break_reasons]
    return explanation.graph_count, explanation.graph_break_count, reasons


# --- the whole step in one CUDA graph -------------------------------------------------------------

NEEDS_GPU = "a CUDA graph needs a GPU"
_REPLAYS = weakref.WeakKeyDictionary()  # compiled step -> the replay of its CUDA graph (run_step_in_one_graph)


def capture_step(step, inputs, warmup=3):
    """Capture one call of step(*inputs) into a CUDA graph after `warmup` calls on a side stream; returns a replay function (chapter 4).

    PyTorch's whole-network capture: the warm-up steps run (and train); the capture records the
    kernels of one step, forward, backward and optimizer, without running them; each replay runs
    them all with one launch. The loss it returns and the gradients live in the graph's memory,
    refilled in place by every replay. Adam must keep its step count on the GPU (capturable);
    a compiled Adam does so by itself when its parameters are on the GPU.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as capture wants
        for _ in range(warmup):
            step(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = step(*inputs)

    def replay():
        graph.replay()
        return loss

    return replay


def run_step_in_one_graph(step, inputs):
    """compare()'s `run` for a compiled TrainStep replayed from one CUDA graph, captured after its first call; eager steps run as they are (chapter 4).

    The first call compiles and returns the first step's loss, as the eager step's first call does.
    Inside another capture (utils.timing.gpu_time_ms) the compiled step runs, so that capture
    records its kernels; without a GPU there is no graph and the step runs as it is.
    """
    compiled = isinstance(step, torch._dynamo.eval_frame.OptimizedModule)
    if not compiled or not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
        return step(*inputs)
    if step not in _REPLAYS:
        first = step(*inputs)  # compiles
        _REPLAYS[step] = capture_step(step, inputs)
        return first
    return _REPLAYS[step]()


def compare_in_one_graph(make_step, inputs, *, workload, device, min_run_time=1.0, extra=None):
    """compare() of eager steps against the compiled step (mode default) replayed from one CUDA graph; skipped, with the reason, without a GPU (chapter 4)."""
    from .compare import row

    config = {"mode": "default"}
    on_gpu = str(device).startswith("cuda") and torch.cuda.is_available()
    rows = compare(make_step, inputs, [config] if on_gpu else [], workload=workload, device=device,
                   run=run_step_in_one_graph, min_run_time=min_run_time, extra=extra)
    if not on_gpu:
        rows.append(row("skipped", NEEDS_GPU, workload=workload, variant="default", **(extra or {}),
                        mode="default", backend="inductor", fullgraph=False, dynamic=None))
    return rows


def fit_in_one_graph(make_model, data, epochs, seed=0, warmup=3):
    """Train a fresh model for `epochs` full-batch steps: one compiling call, `warmup` more, then replays of one CUDA graph (chapter 4).

    Returns the test accuracy (read with the eager model, whose parameters the replays updated in
    place), the last loss and the graphs Dynamo compiled.
    """
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(seed)
    model = attach_adam(make_model())
    step = torch.compile(TrainStep(model))
    model.train()
    inputs = (data.x, data.edge_index, data.y, data.train_idx)
    loss = step(*inputs)  # compiles
    replay = capture_step(step, inputs, warmup=warmup)
    for _ in range(epochs - 1 - warmup):
        loss = replay()
    return {"test_acc": accuracy(model, data, data.test_idx), "final_loss": float(loss),
            "graphs": counters["stats"]["unique_graphs"]}


def fit_seeds_in_one_graph(make_model, data, epochs, seeds):
    """fit_in_one_graph() for each seed, summed up as fit_seeds() does; skipped without a GPU, a failure reported (chapter 4)."""
    if not (torch.cuda.is_available() and data.x.is_cuda):
        return {"test_acc": None, "fit_status": f"skipped: {NEEDS_GPU}"}
    try:
        runs = [fit_in_one_graph(make_model, data, epochs, seed=seed) for seed in seeds]
    except Exception as error:  # a failed capture is a result
        return {"test_acc": None, "fit_status": f"failed: {type(error).__name__}: {str(error)[:200]}"}
    accs = [r["test_acc"] for r in runs]
    return {"test_acc": sum(accs) / len(accs), "test_accs": accs, "epochs": epochs,
            "train_graphs": runs[0]["graphs"], "cuda_graphs": 1, "fit_status": "ok"}


# --- synthetic graphs and neighbour sampling ------------------------------------------------------

def synthetic_graph(num_nodes, num_edges, num_features, num_classes=8, seed=0):
    """A random graph as PyG's benchmark builds one: randn features, randint edges and labels (chapter 4)."""
    from torch_geometric.data import Data

    generator = torch.Generator().manual_seed(seed)
    return Data(x=torch.randn(num_nodes, num_features, generator=generator),
                edge_index=torch.randint(num_nodes, (2, num_edges), generator=generator),
                y=torch.randint(num_classes, (num_nodes,), generator=generator), num_classes=num_classes)


def has_pyg_sampler():
    """Whether PyG's NeighborLoader can sample here: it needs pyg-lib or torch-sparse (chapter 4)."""
    import torch_geometric.typing

    return bool(torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE)


class TorchNeighborSampler:
    """NeighborLoader's sampling in plain torch: up to k in-neighbours per node per hop, without replacement (chapter 4).

    Batches are Data objects like NeighborLoader's: x, y, edge_index (local ids, source -> target),
    n_id (global ids, seeds first) and batch_size (the seeds).
    """

    def __init__(self, data, num_neighbors, seed=0):
        self.data, self.num_neighbors = data, list(num_neighbors)
        self.num_nodes = data.num_nodes
        row, col = data.edge_index
        col, perm = col.sort(stable=True)  # CSC: incoming edges of each node are contiguous
        self.row = row[perm]
        self.colptr = torch.zeros(self.num_nodes + 1, dtype=torch.long)
        self.colptr[1:] = torch.bincount(col, minlength=self.num_nodes).cumsum(0)
        self.generator = torch.Generator().manual_seed(seed)
        self.local = torch.full((self.num_nodes,), -1, dtype=torch.long)  # global id -> batch id

    def sample(self, seeds):
        """The sampled subgraph around `seeds` as a Data batch (chapter 4)."""
        from torch_geometric.data import Data

        n_id = seeds
        self.local[seeds] = torch.arange(seeds.numel())
        frontier, sources, targets = seeds, [], []
        for k in self.num_neighbors:
            start = self.colptr[frontier]
            degree = self.colptr[frontier + 1] - start
            segment = torch.repeat_interleave(torch.arange(frontier.numel()), degree)  # sorted
            offset = torch.arange(segment.numel()) - (degree.cumsum(0) - degree)[segment]
            # shuffle inside each node's neighbour list (segments stay in place), keep the first k
            noise = torch.rand(segment.numel(), generator=self.generator, dtype=torch.float64)
            order = torch.argsort(segment + noise)
            keep = order[offset < k]  # offset doubles as the rank inside the shuffled segment
            src = self.row[start[segment[keep]] + offset[keep]]
            dst = frontier[segment[keep]]
            new = src[self.local[src] < 0].unique()
            self.local[new] = torch.arange(n_id.numel(), n_id.numel() + new.numel())
            n_id = torch.cat([n_id, new])
            sources.append(self.local[src])
            targets.append(self.local[dst])
            frontier = new
        edge_index = torch.stack([torch.cat(sources), torch.cat(targets)])
        self.local[n_id] = -1
        return Data(x=self.data.x[n_id], y=self.data.y[n_id], edge_index=edge_index, n_id=n_id,
                    batch_size=seeds.numel())


def neighbor_batches(data, num_neighbors, batch_size, num_batches, seed=0):
    """`num_batches` sampled mini-batches and the sampler's name: PyG's NeighborLoader if it can run, else ours (chapter 4)."""
    generator = torch.Generator().manual_seed(seed)
    seeds = torch.randperm(data.num_nodes, generator=generator)[:batch_size * num_batches]
    if has_pyg_sampler():
        from torch_geometric.loader import NeighborLoader

        try:
            loader = NeighborLoader(data, num_neighbors=list(num_neighbors), batch_size=batch_size,
                                    input_nodes=seeds, shuffle=False)
            return [batch for batch, _ in zip(loader, range(num_batches))], "torch_geometric.loader.NeighborLoader"
        except Exception as error:  # an extension that does not match this torch: say so, use ours
            print(f"NeighborLoader failed ({type(error).__name__}: {str(error)[:200]}); sampling in plain torch")
    sampler = TorchNeighborSampler(data, num_neighbors, seed=seed)
    return [sampler.sample(s) for s in seeds.split(batch_size)], "utils.gnn.TorchNeighborSampler"


# --- the panel ------------------------------------------------------------------------------------

def gnn_panel(graph, device, hiddens=(16, 64, 256), num_layers=3, min_run_time=0.5):
    """Dropdowns for model, hidden size, dynamic and mode; Run compiles, times forward+backward and plots (chapter 4)."""
    import ipywidgets as w

    from .widgets import MODES, dynamic_dropdown, speedup_panel

    controls = {"model": w.Dropdown(options=list(MODELS), value="GraphSAGE", description="model"),
                "hidden": w.Dropdown(options=list(hiddens), value=64 if 64 in hiddens else hiddens[0],
                                     description="hidden"),
                "dynamic": dynamic_dropdown(),
                "mode": w.Dropdown(options=MODES, value="default", description="mode")}
    x, edge_index = graph.x.to(device), graph.edge_index.to(device)

    def config(v):
        return {"mode": v["mode"], "dynamic": v["dynamic"]}

    def measure(v):
        kind, size = v["model"], v["hidden"]
        grad = torch.randn(x.size(0), size, device=device, generator=torch.Generator(device).manual_seed(0))
        return compare(lambda: make_gnn(kind, x.size(1), size, num_layers).to(device), (x, edge_index, grad),
                       [config(v)], workload=f"{kind} h{size}", device=device, run=run_forward_backward,
                       min_run_time=min_run_time)

    return speedup_panel(controls, measure, lambda v: f"compiling and timing {v['model']}, hidden {v['hidden']}, "
                                                      f"{config(v)} ...",
                         "forward+backward speedup over eager (your runs)")


# --- mini-batches with changing shapes ------------------------------------------------------------

def minibatch_sweep(make_model, batches, config, rounds=7, min_run_time=1.0):
    """Train on `batches` under a compare() config: each first step timed (compiles show), then steady passes against eager (chapter 4).

    Returns per-step first-pass seconds, where graphs were compiled, recompiles, the seconds the
    compiling steps took beyond a steady step, and the steady per-step time over whole passes. A
    compiled config's passes are timed in rounds alternating with an eager model's passes
    (utils.time_interleaved): `speedup` is the median of the per-round ratios eager / compiled,
    `speedup_lo` and `speedup_hi` the extremes, `eager_ms` eager's step in those same rounds.
    """
    from torch._dynamo.utils import counters

    from .timing import quantiles, time_first_call, time_fn, time_interleaved

    eager = config.get("compile") is False
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = attach_adam(make_model())
    if not eager:
        model = torch.compile(model, **compile_kwargs(config))
    inputs = [(b.x, b.edge_index, b.y, slice(0, b.batch_size)) for b in batches]
    first_s, compiled_at = [], []
    for i, batch_inputs in enumerate(inputs):
        before = counters["stats"]["unique_graphs"]
        seconds, _ = time_first_call(lambda: run_model_step(model, batch_inputs))
        first_s.append(seconds)
        if counters["stats"]["unique_graphs"] > before:
            compiled_at.append(i)
    graphs = counters["stats"]["unique_graphs"]

    def one_pass(m):
        for batch_inputs in inputs:
            run_model_step(m, batch_inputs)

    per_step = 1.0 / len(inputs)
    if eager:
        timing = time_fn(lambda: one_pass(model), min_run_time=min_run_time, warmup=1, blocks=rounds)
        p10, median, p90 = timing.p10_ms, timing.median_ms, timing.p90_ms
        eager_ms, ratios = median * per_step, [1.0]
    else:
        torch.manual_seed(0)
        eager_model = attach_adam(make_model())
        timed = time_interleaved({"eager": lambda: one_pass(eager_model), "compiled": lambda: one_pass(model)},
                                 rounds=rounds, min_run_time=min_run_time, warmup=1)
        p10, median, p90 = quantiles(timed.ms["compiled"])
        eager_ms, ratios = timed.median_ms("eager") * per_step, timed.ratios("eager", "compiled")
    steady_s = median * per_step * 1e-3
    compile_s = sum(max(first_s[i] - steady_s, 0.0) for i in compiled_at)
    return {"first_pass_s": first_s, "compiled_at": compiled_at, "graphs": graphs,
            "recompiles": max(graphs - 1, 0), "compile_s": compile_s,
            "recompile_s_each": compile_s / len(compiled_at) if compiled_at else 0.0,
            "median_ms": median * per_step, "p10_ms": p10 * per_step, "p90_ms": p90 * per_step,
            "eager_ms": eager_ms, "speedup": statistics.median(ratios),
            "speedup_lo": min(ratios), "speedup_hi": max(ratios), "rounds": rounds,
            "first_pass_total_s": sum(first_s)}


def plot_step_times(sweeps, ax=None):
    """Seconds of each step in the first pass over the batches, one line per configuration (chapter 4)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    for label, sweep in sweeps.items():
        ms = [s * 1e3 for s in sweep["first_pass_s"]]
        line, = ax.plot(range(len(ms)), ms, marker=".", label=label)
        ax.plot(sweep["compiled_at"], [ms[i] for i in sweep["compiled_at"]], "o", mfc="none",
                color=line.get_color())
    ax.set_yscale("log")
    ax.set_xlabel("mini-batch (first pass; circles: a graph was compiled)")
    ax.set_ylabel("step time, ms")
    ax.legend(fontsize="small")
    ax.figure.tight_layout()
    return ax




def kernels_per_call(fn, calls=5):
    """GPU kernels launched per call of fn, counted by torch.profiler; None without a GPU (chapter 4)."""
    if not torch.cuda.is_available():
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA) / calls


def eager_op_ms(device="cuda", min_run_time=0.5):
    """Wall ms per call of the cheapest eager op (an in-place add on one element, one kernel); None on a CPU (chapter 4).

    Python, the dispatcher and one kernel launch: what issuing a kernel from eager PyTorch costs at the least.
    """
    if not torch.cuda.is_available() or str(device) == "cpu":
        return None
    from .timing import time_fn

    tiny = torch.zeros(1, device=device)
    return time_fn(lambda: tiny.add_(1.0), min_run_time=min_run_time).median_ms


def step_gpu_ms(make_model, inputs):
    """The GPU's own time of an eager training step (forward, loss, backward, Adam) from a CUDA-graph replay; None on a CPU (chapter 4).

    Adam is built with capturable=True, which the capture needs (its step count stays on the GPU).
    """
    if not torch.cuda.is_available():
        return None
    from .timing import gpu_time_ms

    torch.manual_seed(0)
    step = TrainStep(attach_adam(make_model(), capturable=True))
    for _ in range(3):  # Adam's state exists before the capture
        step(*inputs)
    return gpu_time_ms(lambda: step(*inputs))


def compiled_ratio(make_a, inputs_a, make_b, inputs_b, *, run, config, rounds=7, min_run_time=1.0):
    """Two models compiled alike, timed in alternating rounds: b's speed over a's, median and range of the rounds (chapter 4)."""
    from .timing import time_interleaved

    models = []
    for make in (make_a, make_b):
        torch._dynamo.reset()
        torch.manual_seed(0)
        models.append(torch.compile(make(), **compile_kwargs(config)))
    model_a, model_b = models
    timed = time_interleaved({"a": lambda: run(model_a, inputs_a), "b": lambda: run(model_b, inputs_b)},
                             rounds=rounds, min_run_time=min_run_time)
    ratios = timed.ratios("a", "b")
    return {"a_ms": timed.median_ms("a"), "b_ms": timed.median_ms("b"), "ratio": statistics.median(ratios),
            "ratio_lo": min(ratios), "ratio_hi": max(ratios), "rounds": rounds}
