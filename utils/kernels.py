"""Kernels by category: what a profile's kernels (or, on a CPU, operators) spend their time on (chapters 3, 2).

Free of the chapters' libraries (transformers, ipywidgets): chapter 3 (utils.llm) and chapter 2
(utils.training) both count with it.
"""
import json
import re
from pathlib import Path

KERNEL_CATEGORIES = ("matmul (library)", "matmul (Triton)", "attention", "Triton fused", "Inductor C++", "other")
# A training step also runs a loss and an optimizer: kernel_category(name, training=True) adds these (chapter 2).
TRAINING_CATEGORIES = ("loss", "optimizer")


def kernel_category(name, training=False):
    """Which of KERNEL_CATEGORIES (plus TRAINING_CATEGORIES when training) a GPU kernel's or CPU op's name belongs to (chapters 3, 2c)."""
    n = name.lower()
    words = set(re.split(r"[^a-z0-9]+", n))
    if training:  # before attention: eager's log_softmax kernel is a cunn_SoftMax* kernel with a LogSoftMax epilogue
        if any(k in n for k in ("nll_loss", "log_softmax", "logsoftmax", "cross_entropy")):
            return "loss"
        if any(k in n for k in ("multi_tensor_apply", "fused_adam", "_foreach_", "optimizer.step")):
            return "optimizer"
    if any(k in n for k in ("flash", "fmha", "attention", "softmax")) or "bmm" in words:
        return "attention"
    if n.startswith("triton"):  # Inductor names its kernels after the ops they fuse: mm is a matrix product
        return "matmul (Triton)" if words & {"mm", "addmm"} else "Triton fused"
    if any(k in n for k in ("gemm", "gemv", "cublas", "cutlass", "nvjet", "xmma", "splitk")) or \
            words & {"mm", "addmm", "linear", "matmul"}:
        return "matmul (library)"
    if "compiledfxgraph" in n.replace(" ", ""):  # on a CPU, Inductor's C++ kernels run inside this range
        return "Inductor C++"
    return "other"


def gpu_kernels(trace):
    """(name, start_us, duration_us) of each kernel, memcpy and memset in a torch.profiler Chrome trace (chapter 3)."""
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text())
    return [(e["name"], float(e["ts"]), float(e["dur"])) for e in trace.get("traceEvents", [])
            if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]


def time_by_category(named_times, training=False):
    """Sum (name, microseconds) pairs by kernel_category: {category: us}, every category present (chapters 3, 2c)."""
    totals = dict.fromkeys(KERNEL_CATEGORIES + (TRAINING_CATEGORIES if training else ()), 0.0)
    for name, us in named_times:
        totals[kernel_category(name, training)] += us
    return totals
