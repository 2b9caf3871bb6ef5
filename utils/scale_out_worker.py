"""Scaling out (chapter 8), the torchrun worker: what runs inside each process torchrun starts.

Run it with torchrun. Every process trains the same GPT on its own batches; for each
configuration (strategy x compile mode, run one after the other in the same processes, so that
eager and compiled are measured in the same run), rank 0 appends one JSON line to --out:

    torchrun --standalone --nproc_per_node=2 -m utils.scale_out_worker --preset smoke \\
        --strategy ddp,fsdp2 --compile none,default --out rows.jsonl

On GPUs each process owns one GPU (NCCL); without GPUs the processes train on the CPU and talk
through gloo, so the same script runs on a laptop. From Python (a notebook),
`utils.scale_out.launch(nproc, strategies=..., compiles=...)` runs torchrun in a subprocess and
returns the rows; `python -m utils.scale_out` is this command line too.

--compile (a comma-separated list):
  none               eager.
  default            DDP: torch.compile of the DDP-wrapped model. Dynamo's DDPOptimizer splits
                     the graph it captures at DDP's gradient-bucket boundaries, so that a bucket's
                     all-reduce can start while the backward of the layers before it still runs.
                     FSDP2: torch.compile of each transformer block, then fully_shard per block
                     and on the root (torchtitan's order); FSDP2's all-gathers and
                     reduce-scatters run in its hooks, between the compiled blocks.
  compiled_autograd  DDP only: optimize_ddp = "python_reducer" and compiled_autograd = True;
                     forward, loss and backward run in one compiled function and compiled
                     autograd captures the whole backward with DDP's all-reduces in it, instead
                     of DDPOptimizer splitting the forward. It runs after the other modes,
                     since the Python reducer changes process-wide settings.
"""
import argparse
import contextlib
import gc
import json
import logging
import os
import statistics
import time
import traceback

import torch

from .env import provenance
from .models import GPT, count_params
from .training import loss_of, token_batch

STRATEGIES = ("ddp", "fsdp2")
COMPILE_MODES = ("none", "default", "compiled_autograd")
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZE_DDP = ("ddp_optimizer", "no_optimization")  # for --compile default; compiled_autograd uses "python_reducer"

# Every size lives here. batch is per process (weak scaling: N processes train on N x batch).
# DDPOptimizer's first bucket is 1 MiB (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES) and it
# insists that the bucket cap is not smaller, so the smoke model is sized (1.7 MiB) to be split.
PRESETS = {
    "smoke": {"vocab": 256, "seq_len": 32, "n_layers": 2, "d_model": 128, "n_heads": 4, "batch": 4,
              "warmup": 2, "steps": 6, "bucket_cap_mb": 1.0, "lr": 3e-4},
    # GPT ~355M (24 x 1024, GPT-2 medium's shape), bf16 autocast on GPUs; DDP's default 25 MiB buckets
    "full": {"vocab": 50304, "seq_len": 1024, "n_layers": 24, "d_model": 1024, "n_heads": 16, "batch": 8,
             "warmup": 5, "steps": 20, "bucket_cap_mb": 25.0, "lr": 3e-4},
}
DDP_SPLIT_LOGGER = "torch._dynamo.backends.distributed"  # "DDPOptimizer used bucket cap %s and created %d buckets"


# --- checks that give clear errors ------------------------------------------------------------------

def parse_list(name, value, choices):
    """'a,b' -> ['a', 'b'], each checked against choices; a clear ValueError otherwise (chapter 8)."""
    items = [v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]
    if not items:
        raise ValueError(f"No {name} given: choose from {', '.join(choices)}.")
    for item in items:
        if item not in choices:
            raise ValueError(f"Unknown {name} {item!r}: choose from {', '.join(choices)}.")
    return list(dict.fromkeys(items))


def require_fsdp2():
    """fully_shard and MixedPrecisionPolicy, or a clear error on a torch without FSDP2 (chapter 8)."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError as error:
        raise RuntimeError(f"FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6; this is torch "
                           f"{torch.__version__}. Use the ddp strategy, or upgrade torch.") from error
    return fully_shard, MixedPrecisionPolicy


def resolve_device(device):
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu' (chapter 8)."""
    if device not in DEVICES:
        raise ValueError(f"Unknown device {device!r}: choose from {', '.join(DEVICES)}.")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but no GPU is visible: use 'cpu' (gloo) instead.")
    return device


def check_processes(nproc, device):
    """At least one process; on CUDA, no more processes than GPUs (each process owns one) (chapter 8)."""
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"The number of processes must be a positive integer, got {nproc!r}.")
    if device == "cuda":
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            raise ValueError(f"{nproc} processes requested but only {gpus} GPU(s) are visible: each process "
                             f"needs its own GPU. Use at most {gpus}, or the CPU (gloo) with device='cpu'.")


def configurations(strategies, compiles):
    """(strategy, compile) pairs in run order: compiled autograd last, it changes process-wide settings (chapter 8)."""
    strategies = parse_list("strategy", strategies, STRATEGIES)
    compiles = parse_list("compile mode", compiles, COMPILE_MODES)
    if "fsdp2" in strategies:
        require_fsdp2()
    pairs = [(s, c) for s in strategies for c in compiles if not (s == "fsdp2" and c == "compiled_autograd")]
    if not pairs:
        raise ValueError("compiled_autograd is offered with the ddp strategy only (FSDP2's hooks are not "
                         "traced by compiled autograd here): add ddp, or another compile mode.")
    return sorted(pairs, key=lambda p: p[1] == "compiled_autograd")


def sizes_of(preset, **overrides):
    """The preset's sizes with any overrides (steps, warmup, batch, bucket_cap_mb), checked (chapter 8)."""
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}: choose from {', '.join(PRESETS)}.")
    sizes = dict(PRESETS[preset])
    sizes.update({k: v for k, v in overrides.items() if v is not None})
    if sizes["warmup"] < 1 or sizes["steps"] < 1 or sizes["batch"] < 1:
        raise ValueError("warmup, steps and batch must be at least 1 (the first warm-up step compiles).")
    if sizes["bucket_cap_mb"] < 1:
        raise ValueError("bucket_cap_mb must be at least 1: DDPOptimizer's first bucket is 1 MiB and it refuses "
                         "a smaller cap.")
    return sizes


# --- the model, wrapped ------------------------------------------------------------------------------

def make_model(sizes, device, seed=0):
    """The chapter 2 GPT on device, the same weights in every process (same seed), no optimizer yet (chapter 8).

    `training.make_gpt` attaches an optimizer at once; FSDP2 must shard the parameters first and
    build the optimizer over the sharded ones, so this builds the bare model.
    """
    torch.manual_seed(seed)
    return GPT(sizes["vocab"], sizes["seq_len"], sizes["n_layers"], sizes["d_model"], sizes["n_heads"]).to(device)


def count_params_m(sizes):
    """Parameters of the preset's GPT in millions, the tied head counted once (chapter 8)."""
    with torch.device("meta"):
        return count_params(GPT(sizes["vocab"], sizes["seq_len"], sizes["n_layers"], sizes["d_model"],
                                sizes["n_heads"])) / 1e6


def wrap_ddp(model, device, bucket_cap_mb):
    """DistributedDataParallel, one GPU per process on CUDA (chapter 8)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [torch.cuda.current_device()] if device == "cuda" else None
    return DDP(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb)


def wrap_fsdp2(model, device, world_size, compile_blocks):
    """Compile each block if asked, then fully_shard each block and the root (chapter 8).

    Per block, so that one block's parameters are all-gathered (and freed) at a time and the next
    block's all-gather overlaps this block's compute; the root group holds the embeddings, the
    final norm and the tied head. On GPUs parameters are gathered in bf16 and gradients reduced in
    fp32 (MixedPrecisionPolicy); on the CPU everything stays fp32.
    """
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, MixedPrecisionPolicy = require_fsdp2()
    mesh = init_device_mesh(device, (world_size,))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if device == "cuda" else MixedPrecisionPolicy())
    for i, block in enumerate(model.blocks):
        if compile_blocks:
            block = torch.compile(block, fullgraph=True)
            model.blocks[i] = block  # the compiled wrapper takes the block's place, as in torchtitan
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


class ForwardBackward(torch.nn.Module):
    """Forward, loss and backward in one module; compiled with compiled autograd on, the backward is captured (chapter 8)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        loss = loss_of(self.model, x, y)  # chapter 2's loss: bf16 autocast on GPUs
        loss.backward()
        return loss.detach()


def optimize_ddp_mode(strategy, compile_mode, optimize_ddp="ddp_optimizer"):
    """The torch._dynamo.config.optimize_ddp a configuration runs with; None where DDP is not compiled (chapter 8)."""
    if strategy != "ddp" or compile_mode == "none":
        return None
    return "python_reducer" if compile_mode == "compiled_autograd" else optimize_ddp


def prepare(strategy, compile_mode, sizes, device, world_size, optimize_ddp="ddp_optimizer"):
    """A fresh model, wrapped and compiled as asked, and `step(x, y) -> loss` (chapter 8)."""
    model = make_model(sizes, device)
    if strategy == "ddp":
        mode = optimize_ddp_mode(strategy, compile_mode, optimize_ddp)
        if mode:
            # DDP reads this when it is built ("python_reducer": each gradient's all-reduce becomes
            # a post-accumulate-grad hook, which compiled autograd traces into the backward graph;
            # compiled autograd refuses the C++ reducer), Dynamo when it compiles a frame inside
            # DDP's forward ("ddp_optimizer": split the graph at bucket boundaries).
            torch._dynamo.config.optimize_ddp = mode
        wrapped = wrap_ddp(model, device, sizes["bucket_cap_mb"])
    else:
        wrapped = wrap_fsdp2(model, device, world_size, compile_blocks=compile_mode == "default")
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=sizes["lr"])

    if compile_mode == "compiled_autograd":
        with torch._dynamo.config.patch(compiled_autograd=True):  # read when torch.compile wraps the module
            forward_backward = torch.compile(ForwardBackward(wrapped))
    else:
        if strategy == "ddp" and compile_mode == "default":
            wrapped = torch.compile(wrapped)
        forward_backward = ForwardBackward(wrapped)

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = forward_backward(x, y)
        optimizer.step()
        return loss

    return step


# --- measuring -------------------------------------------------------------------------------------

class DDPBucketLog(logging.Handler):
    """Collects the bucket counts DDPOptimizer logs, one per graph it considered splitting (chapter 8)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.buckets = []

    def emit(self, record):
        if "DDPOptimizer used bucket cap" in str(record.msg) and len(record.args or ()) >= 2:
            self.buckets.append(int(record.args[1]))


@contextlib.contextmanager
def ddp_bucket_log():
    """Listen to DDPOptimizer's INFO log while the block runs (chapter 8)."""
    logger = logging.getLogger(DDP_SPLIT_LOGGER)
    handler, old_level = DDPBucketLog(), logger.level
    logger.addHandler(handler)
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def rank_batches(rank, sizes, device, n=2):
    """n batches for this rank, different on every rank: data parallel means different data (chapter 8)."""
    return [token_batch(sizes["batch"], sizes["seq_len"], sizes["vocab"], device, seed=1000 * rank + i)
            for i in range(n)]


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def percentile(values, q):
    """The q-quantile (0..1) of a list, linearly interpolated (chapter 8)."""
    return torch.quantile(torch.tensor(values, dtype=torch.float64), q).item()


def break_reason(text):
    """A graph break's reason in one line: its title and Dynamo's explanation, if it gives one (chapter 8)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    explanation = next((line.removeprefix("Explanation:").strip() for line in lines[1:3]
                        if line.startswith("Explanation:")), None)
    return (f"{lines[0]}: {explanation}" if explanation else lines[0])[:240]


def train(strategy, compile_mode, sizes, device, rank, world_size, optimize_ddp="ddp_optimizer"):
    """Warm-up steps (the first one compiles), then a fixed number of timed steps; this rank's numbers (chapter 8).

    Every process must run the same number of steps (each step's collectives wait for all of
    them), so the step count is fixed rather than adaptive as in utils.time_fn; each step is timed
    alone, between synchronisations, and the median is reported.
    """
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    batches = rank_batches(rank, sizes, device)
    losses, times = [], []
    with ddp_bucket_log() as ddp_log:
        step = prepare(strategy, compile_mode, sizes, device, world_size, optimize_ddp)
        for i in range(sizes["warmup"] + sizes["steps"]):
            sync(device)
            start = time.perf_counter()
            loss = step(*batches[i % len(batches)])
            sync(device)
            times.append(time.perf_counter() - start)
            losses.append(loss.item())
    timed_ms = [1e3 * t for t in times[sizes["warmup"]:]]
    median_ms = statistics.median(timed_ms)
    breaks = counters["graph_break"]
    result = {
        "rank": rank,
        "tok_s": sizes["batch"] * sizes["seq_len"] / (median_ms / 1e3),
        "median_ms": median_ms, "p10_ms": percentile(timed_ms, 0.1), "p90_ms": percentile(timed_ms, 0.9),
        "first_step_s": times[0],
        "losses": losses,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None,
        "graphs": int(counters["stats"]["unique_graphs"]),
        "aot_graphs": int(counters["aot_autograd"]["total"]),
        "graph_breaks": int(sum(breaks.values())),
        "graph_break_reasons": sorted(break_reason(k) for k in breaks),
        "ddp_buckets": ddp_log.buckets,
        "compiled_autograd_captures": int(counters["compiled_autograd"]["captures"]),
    }
    del step
    gc.collect()
    return result


def summarise(per_rank, strategy, compile_mode, preset, sizes, device, world_size, optimize_ddp="ddp_optimizer"):
    """One row for a configuration, from every rank's numbers (chapter 8).

    Step times are the slowest rank's (all ranks wait for it); tok_s_per_gpu is the mean over
    ranks of tokens per second per process, tok_s_total their sum; graph counts are rank 0's.
    """
    first = per_rank[0]
    tok_s = [r["tok_s"] for r in per_rank]
    return {
        "workload": f"gpt {strategy} x{world_size}", "variant": "eager" if compile_mode == "none" else compile_mode,
        "status": "ok", "strategy": strategy, "compile": compile_mode, "preset": preset,
        "device": device, "backend": "nccl" if device == "cuda" else "gloo", "world_size": world_size,
        "batch_per_rank": sizes["batch"], "seq_len": sizes["seq_len"], "params_m": count_params_m(sizes),
        "bucket_cap_mb": sizes["bucket_cap_mb"] if strategy == "ddp" else None,
        "optimize_ddp": optimize_ddp_mode(strategy, compile_mode, optimize_ddp),
        "tok_s_per_gpu": sum(tok_s) / len(tok_s), "tok_s_total": sum(tok_s),
        "median_ms": max(r["median_ms"] for r in per_rank),
        "p10_ms": max(r["p10_ms"] for r in per_rank), "p90_ms": max(r["p90_ms"] for r in per_rank),
        "compile_s": max(r["first_step_s"] for r in per_rank) if compile_mode != "none" else 0.0,
        "first_step_s": max(r["first_step_s"] for r in per_rank),
        "peak_mem_gb": None if first["peak_mem_gb"] is None else max(r["peak_mem_gb"] for r in per_rank),
        "graphs": first["graphs"], "aot_graphs": first["aot_graphs"],
        "graph_breaks": first["graph_breaks"], "graph_break_reasons": first["graph_break_reasons"],
        "ddp_buckets": max(first["ddp_buckets"]) if first["ddp_buckets"] else None,
        "compiled_autograd_captures": first["compiled_autograd_captures"],
        "loss": statistics.fmean(r["losses"][-1] for r in per_rank),
        "steps": sizes["warmup"] + sizes["steps"], "timed_steps": sizes["steps"],
        "per_rank": per_rank,
    }


def add_speedups(rows):
    """speedup = eager median / compiled median, per strategy, within one run (chapter 8)."""
    for row in rows:
        eager = next((r for r in rows if r["strategy"] == row["strategy"] and r["compile"] == "none"
                      and r["status"] == "ok"), None)
        ok = row["status"] == "ok" and eager is not None
        row["speedup"] = eager["median_ms"] / row["median_ms"] if ok else None
    return rows


def failed_row(strategy, compile_mode, preset, device, world_size, error):
    last = traceback.format_exception_only(type(error), error)[-1].strip()
    return {"workload": f"gpt {strategy} x{world_size}", "variant": "eager" if compile_mode == "none" else compile_mode,
            "status": f"failed: {last[:300]}", "strategy": strategy, "compile": compile_mode, "preset": preset,
            "device": device, "world_size": world_size}


# --- the command line ---------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="torchrun --standalone --nproc_per_node=N -m utils.scale_out_worker",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smoke", choices=list(PRESETS))
    parser.add_argument("--strategy", default="ddp", help="ddp, fsdp2 or both: ddp,fsdp2 (default ddp)")
    parser.add_argument("--compile", default="none,default",
                        help="comma-separated: none, default, compiled_autograd (default none,default)")
    parser.add_argument("--device", default="auto", choices=DEVICES, help="auto: cuda when GPUs are visible, else cpu")
    parser.add_argument("--out", required=True, help="JSON-lines file rank 0 appends one row per configuration to")
    parser.add_argument("--steps", type=int, help="timed steps (default: the preset's)")
    parser.add_argument("--warmup", type=int, help="untimed steps before them; the first compiles (default: the preset's)")
    parser.add_argument("--batch", type=int, help="sequences per process (default: the preset's)")
    parser.add_argument("--bucket-cap-mb", type=float, help="DDP's bucket size in MiB (default: the preset's)")
    parser.add_argument("--optimize-ddp", default="ddp_optimizer", choices=OPTIMIZE_DDP,
                        help="torch._dynamo.config.optimize_ddp for --compile default with DDP (default ddp_optimizer)")
    args = parser.parse_args(argv)
    try:
        args.configs = configurations(args.strategy, args.compile)
        args.sizes = sizes_of(args.preset, steps=args.steps, warmup=args.warmup, batch=args.batch,
                              bucket_cap_mb=args.bucket_cap_mb)
        args.device = resolve_device(args.device)
    except (ValueError, RuntimeError) as error:
        parser.error(str(error))
    return args


def main(argv=None):
    """One torchrun run: set up the process group, run each configuration, rank 0 writes the rows (chapter 8)."""
    import torch.distributed as dist

    args = parse_args(argv)
    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        raise SystemExit("utils.scale_out_worker runs under torchrun, e.g.\n  torchrun --standalone --nproc_per_node=2 "
                         "-m utils.scale_out_worker --preset smoke --strategy ddp --compile none,default --out rows.jsonl")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    device = args.device
    if device == "cuda":
        try:
            check_processes(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), device)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        torch.cuda.set_device(local_rank)
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # no CUDA_HOME notice on CPU
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rows = []
    try:
        for strategy, compile_mode in args.configs:
            try:
                result = train(strategy, compile_mode, args.sizes, device, rank, world_size, args.optimize_ddp)
            except Exception as error:  # a compile error is a result; the other ranks fail the same way
                result = error
            gathered = [None] * world_size
            dist.all_gather_object(gathered, result if not isinstance(result, Exception) else repr(result))
            if rank != 0:
                continue
            if isinstance(result, Exception) or any(isinstance(g, str) for g in gathered):
                error = result if isinstance(result, Exception) else RuntimeError(next(g for g in gathered if isinstance(g, str)))
                row = failed_row(strategy, compile_mode, args.preset, device, world_size, error)
            else:
                row = summarise(gathered, strategy, compile_mode, args.preset, args.sizes, device, world_size,
                                args.optimize_ddp)
            rows.append(row)
            add_speedups(rows)
            row["provenance"] = provenance(args.preset)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(describe(row), flush=True)
        dist.barrier()  # rank 0 may still be writing: no rank tears the group down while another uses it
    finally:
        dist.destroy_process_group()


def describe(row):
    """One line per row, for logs (chapter 8)."""
    if row["status"] != "ok":
        return f"{row['workload']} {row['variant']}: {row['status']}"
    return (f"{row['workload']} {row['variant']}: {row['tok_s_per_gpu']:,.0f} tokens/s per process, "
            f"step {row['median_ms']:.1f} ms, first step {row['first_step_s']:.1f} s, loss {row['loss']:.4f}, "
            f"graphs {row['graphs']} (AOT {row['aot_graphs']}), breaks {row['graph_breaks']}, "
            f"DDP buckets {row['ddp_buckets']}")


if __name__ == "__main__":
    main()
