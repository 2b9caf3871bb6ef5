"""Chapter 2's helpers: training steps for ResNet-50 and a GPT-style decoder, MFU, accumulation, the optimizer step,
regional compile, and a profile of the training step by kernel category and phase."""
import contextlib
import json
import statistics
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from .compare import compare, cudagraph_step_begin, recount_model_breaks  # noqa: F401 (re-exported for chapter 2)
from .kernels import gpu_kernels, time_by_category
from .models import GPT  # also re-exported: utils.training.GPT
from .timing import sync, time_first_call, time_fn


# --- models ---------------------------------------------------------------------------------------

def make_gpt(vocab, seq_len, n_layers, d_model, n_heads, device, lr=3e-4, fused=None):
    """A GPT with fp32 weights on device and an AdamW optimizer at `model.optimizer` (chapter 2)."""
    model = GPT(vocab, seq_len, n_layers, d_model, n_heads).to(device)
    model.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=fused)
    return model


def make_resnet(layers, num_classes, device, lr=0.1):
    """torchvision's ResNet-50 when layers is [3, 4, 6, 3] (else a shallower Bottleneck ResNet), channels_last, SGD momentum (chapter 2)."""
    import torchvision
    from torchvision.models.resnet import Bottleneck, ResNet

    if list(layers) == [3, 4, 6, 3]:
        model = torchvision.models.resnet50(weights=None, num_classes=num_classes)
    else:
        model = ResNet(Bottleneck, list(layers), num_classes=num_classes)
    model = model.to(device, memory_format=torch.channels_last)
    model.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return model


def image_batch(batch, size, num_classes, device, seed=0):
    """Random images (channels_last) and labels (chapter 2)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, size, size, generator=g).to(device, memory_format=torch.channels_last)
    return images, torch.randint(0, num_classes, (batch,), generator=g).to(device)


def token_batch(batch, seq_len, vocab, device, seed=0):
    """Random token ids and the next-token targets (chapter 2)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=g).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


# --- the training step ----------------------------------------------------------------------------

def autocast(device):
    """bf16 autocast on a GPU, nothing on a CPU (the smoke run trains in fp32) (chapter 2)."""
    if device == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loss_of(model, x, y):
    """Cross-entropy of model(x) against y, under autocast on a GPU (chapter 2)."""
    with autocast(x.device.type):
        out = model(x)
    return F.cross_entropy(out.float().flatten(0, -2), y.flatten())


def train_step(model, inputs):
    """compare()'s `run`: zero grads, forward, loss, backward, optimizer step; returns the loss (chapter 2)."""
    cudagraph_step_begin()
    x, y = inputs
    model.optimizer.zero_grad(set_to_none=True)
    loss = loss_of(model, x, y)
    loss.backward()
    model.optimizer.step()
    return loss.detach()


def accumulate_grads(model, micro_batches):
    """Backward of each micro-batch's loss / n, gradients summed in .grad; returns the mean loss (chapter 2)."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for x, y in micro_batches:
        loss = loss_of(model, x, y) / len(micro_batches)
        loss.backward()
        total += loss.detach()
    return total


def split_batch(inputs, n):
    """Cut a batch (x, y) into n micro-batches of equal size (chapter 2)."""
    x, y = inputs
    if x.shape[0] % n:
        raise ValueError(f"batch {x.shape[0]} does not split into {n} equal micro-batches")
    return list(zip(x.chunk(n), y.chunk(n)))


def loss_curve(model, batches, steps):
    """Losses of `steps` training steps cycling through `batches` (chapter 2)."""
    return [train_step(model, batches[i % len(batches)]).item() for i in range(steps)]


# --- arithmetic: FLOPs and MFU ----------------------------------------------------------------------

def gpt_train_flops(model, tokens):
    """FLOPs of one training step: 6 x non-embedding params x tokens + 12 x layers x d_model x seq x tokens (attention) (chapter 2)."""
    n_params = sum(p.numel() for p in model.parameters()) - model.tok.weight.numel() - model.pos.weight.numel()
    n_layers, d_model = len(model.blocks), model.tok.weight.shape[1]
    seq_len = model.pos.weight.shape[0]
    # the LM head's matmul is tied to the embedding, so add it back: 6 x vocab x d_model per token
    head = model.tok.weight.numel()
    return 6 * (n_params + head) * tokens + 12 * n_layers * d_model * seq_len * tokens


def mfu(flops, seconds, peak_flops_per_s):
    """Model FLOPs utilisation: achieved FLOP/s over the peak rate (chapter 2)."""
    return flops / seconds / peak_flops_per_s


def matmul_flops_per_s(n, device, dtype, min_run_time=1.0):
    """Measured rate of an n x n x n matmul in FLOP/s: the ceiling MFU is measured against (chapter 2)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    timing = time_fn(lambda: a @ b, min_run_time=min_run_time)
    return 2 * n ** 3 / (timing.median_ms / 1e3)


# --- optimizer, compiled autograd, regional compilation ---------------------------------------------

def fill_grads(model, seed=0):
    """Give every parameter a random gradient, so optimizer steps can be timed alone (chapter 2)."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = (torch.randn(p.shape, generator=g) * 1e-3).to(p.device, p.dtype)


OPTIMIZER_VARIANTS = {"eager foreach": {"foreach": True}, "fused=True": {"fused": True}, "compiled": {}}


def lr_schedule_graphs(model, lr, steps):
    """Graphs Dynamo compiles for `steps` compiled AdamW steps while LinearLR changes lr (a float or a tensor) (chapter 2)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    fill_grads(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=steps)
    counter = CompileCounter()  # counts Dynamo's graphs, runs them without Inductor: recompiles are Dynamo's decision
    step = torch.compile(optimizer.step, backend=counter)
    for _ in range(steps):
        step()
        scheduler.step()
    torch._dynamo.reset()
    return counter.frame_count


class LossBackward(nn.Module):
    """Forward, loss and backward in one module, so compiled autograd can capture the backward (chapter 2)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.optimizer = model.optimizer

    def forward(self, x, y):
        loss = loss_of(self.model, x, y)
        loss.backward()
        return loss.detach()


def loss_backward_step(module, inputs):
    """compare()'s `run` for a LossBackward: zero grads, forward + backward, optimizer step (chapter 2)."""
    cudagraph_step_begin()
    module.optimizer.zero_grad(set_to_none=True)
    loss = module(*inputs)
    module.optimizer.step()
    return loss


def regional_compile(model, **compile_kwargs):
    """Compile each transformer block in place (`block.compile()`), leaving the rest eager; returns model (chapter 2)."""
    for block in model.blocks:
        block.compile(**compile_kwargs)
    return model


# --- chapter 2: where a training step's time goes ----------------------------------------------------

PHASES = ("forward + loss", "backward", "optimizer")


def phased_train_step(model, inputs):
    """Chapter 2c: train_step with a profiler range ("step: <phase>") around each of PHASES; returns the loss."""
    x, y = inputs
    model.optimizer.zero_grad(set_to_none=True)
    with torch.profiler.record_function("step: forward + loss"):
        loss = loss_of(model, x, y)
    with torch.profiler.record_function("step: backward"):
        loss.backward()
    with torch.profiler.record_function("step: optimizer"):
        model.optimizer.step()
    return loss.detach()


def phase_ranges(trace):
    """Chapter 2c: (start_us, end_us, phase) of each "step: <phase>" profiler range of a Chrome trace (dict)."""
    names = {f"step: {phase}" for phase in PHASES}
    return [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"].removeprefix("step: "))
            for e in trace.get("traceEvents", []) if e.get("cat") == "user_annotation" and e.get("name") in names]


def kernel_phases(trace):
    """Chapter 2c: (name, duration_us, phase) of each GPU kernel; its phase is the range its CPU launch fell in."""
    events, ranges = trace.get("traceEvents", []), phase_ranges(trace)
    launched = {e["args"]["correlation"]: float(e["ts"]) for e in events  # cudaLaunchKernel, cuLaunchKernel...
                if str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    kernels = [e for e in events if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    out = []
    for e in kernels:
        ts = launched.get(e.get("args", {}).get("correlation"))
        phase = next((p for start, end, p in ranges if ts is not None and start <= ts <= end), "unattributed")
        out.append((e["name"], float(e["dur"]), phase))
    return out


def step_summary(trace, steps, cpu_ops=None):
    """Chapter 2c: per step, from a profile's Chrome trace: kernel us by category and phase, kernels, GPU span, CPU us by phase.

    On a CPU, cpu_ops [(name, self us)] stand in for the kernels, and there is no phase or span on a GPU to measure.
    """
    ranges = phase_ranges(trace)
    calls = sum(1 for e in trace.get("traceEvents", []) if str(e.get("name", "")).startswith("## Call CompiledFxGraph"))
    result = {"steps": steps, "graph_calls_per_step": calls / steps,
              "host_us": {p: sum(end - start for start, end, q in ranges if q == p) / steps for p in PHASES},
              "phase_us": None, "kernels_per_step": None, "gpu_span_us": None}
    named = cpu_ops
    if cpu_ops is None:
        kernels = kernel_phases(trace)
        named = [(name, dur) for name, dur, _ in kernels]
        result["phase_us"] = {p: sum(d for _, d, q in kernels if q == p) / steps for p in PHASES + ("unattributed",)}
        result["kernels_per_step"] = len(kernels) / steps
        spans = [(ts, ts + dur) for _, ts, dur in gpu_kernels(trace)]
        result["gpu_span_us"] = (max(e for _, e in spans) - min(s for s, _ in spans)) / steps if spans else None
    result["category_us"] = {c: us / steps for c, us in time_by_category(named, training=True).items()}
    return result


def profile_train_steps(model, inputs, steps):
    """Chapter 2c: step_summary of `steps` phased training steps under torch.profiler (CUDA activity on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = next(model.parameters()).is_cuda
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(steps):
            phased_train_step(model, inputs)
        sync()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train_steps.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    # on a CPU: operators' self time (it does not nest, so it adds up)
    cpu_ops = None if cuda else [(e.key, e.self_cpu_time_total) for e in prof.key_averages()]
    return {"activity": "CUDA kernels" if cuda else "CPU ops only, no GPU", **step_summary(trace, steps, cpu_ops)}


# --- chapter 2 measured in parts: eager against prepared steps, the optimizer in rounds, profiles, floors ---

# Data sheets' dense bf16 tensor-core peaks (no sparsity), FLOP/s, by a name the GPU's name contains; the first match wins.
SPEC_BF16_FLOPS = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12),
                   ("A10G", 70e12), ("A10", 125e12), ("L4", 121e12), ("T4", 65e12))


def spec_bf16_flops(gpu):
    """The data sheet's dense bf16 peak of a GPU by its name (T4: fp16, it has no bf16 units), or None (chapter 2)."""
    return next((flops for name, flops in SPEC_BF16_FLOPS if name.lower() in str(gpu).lower()), None)


def with_mfu(rows, step_flops, matmul_rate, spec_peak=None):
    """Rows with `mfu` (fraction of the measured matmul rate) and `mfu_spec` (of the data sheet's peak, or None) (chapter 2)."""
    return [{**r, "mfu": mfu(step_flops, r["median_ms"] / 1e3, matmul_rate),
             "mfu_spec": None if not spec_peak else mfu(step_flops, r["median_ms"] / 1e3, spec_peak)}
            if r.get("status") == "ok" and r.get("median_ms") else r for r in rows]


def against_eager(make_eager, variants, inputs, *, min_run_time=1.0, workload="train_step", extra=None):
    """Eager training steps against each prepared model's ({name: (make_prepared, mode)}), in alternating rounds (chapter 2).

    The rows of diffusion.compare_prepared with `train_step` as the step: speedup with the range of
    its rounds, compile seconds (the first step), GPU ms, graphs, peak memory, error of the first loss.
    """
    from .diffusion import compare_prepared

    return compare_prepared(make_eager, variants, inputs, workload=workload, run=lambda m, x: train_step(m, x),
                            min_run_time=min_run_time, extra=extra)


def optimizer_rounds(model, variants=OPTIMIZER_VARIANTS, rounds=7, min_run_time=1.0, lr=3e-4):
    """Each AdamW variant's step on model's parameters with fixed gradients: first call alone, then all in alternating rounds (chapter 2).

    Rows: median ms and spread, compile_s (the compiled variant's first call), and the speedup over the
    first variant as the median of per-round ratios with its range. A variant that fails is a row too.
    """
    from .compare import failure_reason
    from .timing import quantiles, time_interleaved

    fill_grads(model)
    torch._dynamo.reset()
    steps, rows = {}, {}
    for variant in variants:
        try:
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, **OPTIMIZER_VARIANTS[variant])
            step = torch.compile(optimizer.step) if variant == "compiled" else optimizer.step
            first_s, _ = time_first_call(step)
        except Exception as error:  # fused AdamW is not built for every device; out of memory is a result too
            rows[variant] = {"workload": "optimizer_step", "variant": variant, "status": "failed",
                             "reason": failure_reason(error)}
            continue
        steps[variant] = step
        rows[variant] = {"workload": "optimizer_step", "variant": variant, "status": "ok",
                         "compile_s": first_s if variant == "compiled" else 0.0}
    timed = time_interleaved(steps, rounds=rounds, min_run_time=min_run_time)
    base = next(iter(steps), None)
    for variant in steps:
        ratios = timed.ratios(base, variant)
        p10, median, p90 = quantiles(timed.ms[variant])
        rows[variant].update(median_ms=median, p10_ms=p10, p90_ms=p90, speedup=statistics.median(ratios),
                             speedup_lo=min(ratios), speedup_hi=max(ratios), rounds=rounds)
    torch._dynamo.reset()
    return [rows[v] for v in variants]


def profile_row(model, inputs, steps, min_run_time=1.0):
    """A prepared model's steady step time and its profile (profile_train_steps), flat: kernel ms, gap ms, by category and phase (chapter 2)."""
    train_step(model, inputs)  # compiled models compile here, outside the timing and the profile
    timing = time_fn(lambda: train_step(model, inputs), min_run_time=min_run_time)
    prof = profile_train_steps(model, inputs, steps)
    kernel_ms = sum(prof["category_us"].values()) / 1e3
    cuda = prof["phase_us"] is not None
    return {"median_ms": timing.median_ms, "activity": prof["activity"], "profiled_steps": steps,
            "kernels_per_step": prof["kernels_per_step"], "graph_calls_per_step": prof["graph_calls_per_step"],
            "kernel_ms": kernel_ms, "gap_ms": timing.median_ms - kernel_ms if cuda else None,
            "host_ms": sum(prof["host_us"].values()) / 1e3,
            **{f"kernel_ms_{c}": us / 1e3 for c, us in prof["category_us"].items()},
            **{f"phase_kernel_ms_{p}": us / 1e3 for p, us in (prof["phase_us"] or {}).items()},
            **{f"phase_host_ms_{p}": us / 1e3 for p, us in prof["host_us"].items()}}


def verdict(row, field="speedup"):
    """'faster than', 'slower than' or 'about as fast as': where the whole range of a row's rounds lies against one (chapter 2)."""
    if not row or row.get(field) is None:
        return "not measured against"
    lo, hi = row.get(f"{field}_lo", row[field]), row.get(f"{field}_hi", row[field])
    return "faster than" if lo > 1 else "slower than" if hi < 1 else "about as fast as"


# --- the panel ------------------------------------------------------------------------------------

def training_panel(workloads, device, modes, min_run_time=0.5):
    """Dropdowns for mode and workload ({label: (make_model, inputs)}); Run compiles a fresh training step, times it, plots (chapter 2)."""
    import ipywidgets as w

    from .widgets import speedup_panel

    controls = {"mode": w.Dropdown(options=modes, value=modes[0], description="mode"),
                "model": w.Dropdown(options=list(workloads), description="model")}

    def measure(v):
        make_model, inputs = workloads[v["model"]]
        return compare(make_model, inputs, [{"mode": v["mode"]}], workload=v["model"], device=device,
                       run=train_step, min_run_time=min_run_time)

    return speedup_panel(controls, measure, lambda v: f"compiling and timing mode={v['mode']} for {v['model']} ...",
                         "training-step speedup over eager (your runs)")


def plot_loss_curves(curves, ax=None):
    """Loss per step, one line per variant, overlaid (chapter 2)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for (name, losses), style in zip(curves.items(), ["-", "--", ":", "-."]):
        ax.plot(range(1, len(losses) + 1), losses, style, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend()
    ax.figure.tight_layout()
    return ax
