"""Chapter 4's helpers: Cora offline, PyG models, training steps, synthetic graphs, a neighbour sampler, a panel.

Works with torch 2.11 to 2.14 and torch_geometric 2.8. Nothing here downloads unless asked to.
"""
import contextlib
import io
import os
import shutil
import socket
import stat
import tempfile
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

def planetoid_root(root=None):
    """The Planetoid folder: `root`, else $PLANETOID_ROOT, else data/planetoid in the repository (chapter 4)."""
    return Path(root or os.environ.get("PLANETOID_ROOT") or REPO_ROOT / "data" / "planetoid")


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
    copy = Path(tempfile.mkdtemp(prefix="planetoid-"))
    print(f"{cora} is read-only: reading a copy in {copy}")
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


def attach_adam(model, lr=0.01, weight_decay=5e-4):
    """Give model an Adam optimizer at `model.optimizer` (a compiled model forwards the attribute) (chapter 4)."""
    model.optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
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

def minibatch_sweep(make_model, batches, config, blocks=10):
    """Train on `batches` under a compare() config: each first step timed (compiles show), then the steady step (chapter 4).

    Returns per-step first-pass seconds, where graphs were compiled, recompiles, the seconds the
    compiling steps took beyond a steady step, and the steady per-step time over whole passes.
    """
    from torch._dynamo.utils import counters

    from .timing import time_first_call, time_fn

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = attach_adam(make_model())
    if config.get("compile") is not False:
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

    def one_pass():
        for batch_inputs in inputs:
            run_model_step(model, batch_inputs)

    timing = time_fn(one_pass, min_run_time=0.0, warmup=1, blocks=blocks)
    per_step = 1e-3 / len(inputs)
    steady_s = timing.median_ms * per_step
    compile_s = sum(max(first_s[i] - steady_s, 0.0) for i in compiled_at)
    return {"first_pass_s": first_s, "compiled_at": compiled_at, "graphs": graphs,
            "recompiles": max(graphs - 1, 0), "compile_s": compile_s,
            "recompile_s_each": compile_s / len(compiled_at) if compiled_at else 0.0,
            "median_ms": steady_s * 1e3, "p10_ms": timing.p10_ms * per_step * 1e3,
            "p90_ms": timing.p90_ms * per_step * 1e3, "first_pass_total_s": sum(first_s)}


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


def table(rows, columns):
    """Print measurement rows as an aligned table; rows that did not run show their status (chapter 4)."""
    print("  ".join(f"{c:>14}" for c in columns))
    for row in rows:
        if row.get("status", "ok") != "ok":
            print(f"{row['workload']:>14}  {row['variant']:>14}  {row['status']}")
            continue
        cells = []
        for c in columns:
            v = row.get(c)
            cells.append(f"{v:>14.4g}" if isinstance(v, float) else f"{str(v):>14}")
        print("  ".join(cells))


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
