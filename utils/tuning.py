"""Chapter 6's helpers: logs caught as text, graph breaks and recompiles counted, Inductor knobs measured alone."""
import contextlib
import io
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch._dynamo
from torch._dynamo.utils import counters

LOG_PREFIX = re.compile(r"^[VDIWEC]\d{4} [\d:.]+ +\d+ \S+\] (\[[^\]]*\] )*")


def clean_log(text):
    """Log lines without their level, time, process and file prefix (chapter 6)."""
    return [LOG_PREFIX.sub("", line) for line in text.splitlines() if line.strip()]


@contextlib.contextmanager
def captured_logs(**artifacts):
    """Turn on torch._logging artifacts (graph_breaks=True, ...) and catch what torch logs as a list of lines (chapter 6)."""
    lines, buffer = [], io.StringIO()
    try:
        with contextlib.redirect_stderr(buffer):
            torch._logging.set_logs(**artifacts)  # its handlers write to the stderr of this moment: the buffer
            try:
                yield lines
            finally:
                torch._logging.set_logs()
    finally:
        torch._logging.set_logs()  # handlers back on the real stderr
        lines.extend(clean_log(buffer.getvalue()))


def breaks(fn, *args):
    """Graphs, graph breaks and the first line of each break's reason, by torch._dynamo.explain (chapter 6)."""
    torch._dynamo.reset()
    with captured_logs():
        explanation = torch._dynamo.explain(fn)(*args)
    return {"graphs": explanation.graph_count, "graph_breaks": explanation.graph_break_count,
            "reasons": [r.reason.strip().splitlines()[0] for r in explanation.break_reasons]}


def count_compiles(fn, calls, **compile_kwargs):
    """Compile fn, run each call(compiled) in turn: graphs made, seconds spent, recompile-limit hits (chapter 6)."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, **compile_kwargs)
    with captured_logs() as lines:
        start = time.perf_counter()
        for call in calls:
            call(compiled)
        seconds = time.perf_counter() - start
    return {"graphs": counters["stats"]["unique_graphs"], "seconds": seconds, "calls": len(calls),
            "hit_limit": any("recompile_limit" in line or "cache_size_limit" in line for line in lines)}


def config_has(settings, module=None):
    """The names in `settings` this torch's config module lacks (torch._inductor.config by default) (chapter 6)."""
    import torch._inductor.config as inductor_config

    module = module or inductor_config
    missing = []
    for name in settings:
        owner = module
        for part in name.split("."):
            if not hasattr(owner, part):
                missing.append(name)
                break
            owner = getattr(owner, part)
    return missing


def knob_rows(make_model, inputs, knob, *, workload, device, run=None, cold_cache=False, **compare_kwargs):
    """One knob alone (mode and Inductor settings) against eager in alternating rounds, via utils.compare (chapter 6).

    `knob` is {"name", "mode" (optional), "inductor": {setting: value}, "gpu_only": reason, "training": bool}.
    A setting this torch lacks, or a GPU-only knob on a CPU, gives a skipped row with the reason.
    With `cold_cache`, the knob compiles in an empty cache folder, as a first compile would: its
    `compile_s` then owes nothing to the kernels and autotuning results of knobs measured before it.
    """
    from .compare import compare, forward
    from .compiler import compile_cache

    settings = knob.get("inductor", {})
    fields = {"workload": workload, "variant": knob["name"], "knob": knob["name"]}
    missing = config_has(settings)
    if missing:
        return [{**fields, "status": "skipped", "reason": f"not in torch {torch.__version__}: {', '.join(missing)}"}]
    if device == "cpu" and knob.get("gpu_only"):
        return [{**fields, "status": "skipped", "reason": knob["gpu_only"]}]
    config = {"mode": knob.get("mode", "default")}
    with contextlib.ExitStack() as stack:
        if cold_cache:
            stack.enter_context(compile_cache(stack.enter_context(tempfile.TemporaryDirectory())))
        stack.enter_context(captured_logs())
        stack.enter_context(torch._inductor.config.patch(settings))
        rows = compare(make_model, inputs, [config], workload=workload, device=device, run=run or forward,
                       **compare_kwargs)
    return [{**r, "variant": knob["name"] if r["variant"] != "eager" else "eager", "knob": knob["name"]} for r in rows]


def relative_to(rows, reference="default"):
    """Each ok row's speedup divided by the reference variant's on the same workload (ratios of ratios) (chapter 6)."""
    ref = {r["workload"]: r["speedup"] for r in rows if r["variant"] == reference and r.get("status") == "ok"}
    return [{**r, "vs_default": (r["speedup"] / ref[r["workload"]]
                                 if r.get("status") == "ok" and r["workload"] in ref else None)} for r in rows]


def tlparse_report(trace_dir, out_dir):
    """Run tlparse on the newest log of a TORCH_TRACE folder into out_dir: (path of its index.html, None) or (None, why not) (chapter 6)."""
    beside = Path(sys.executable).parent / "tlparse"  # installed in this environment, maybe not on PATH
    exe = str(beside) if beside.exists() else shutil.which("tlparse")
    if exe is None:
        return None, "tlparse is not installed (pip install tlparse)"
    logs = sorted(Path(trace_dir).glob("*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return None, f"no trace in {trace_dir}: was TORCH_TRACE set for the process that compiled?"
    proc = subprocess.run([exe, str(logs[-1]), "-o", str(out_dir), "--overwrite", "--no-browser"],
                          capture_output=True, text=True, timeout=300)
    index = Path(out_dir) / "index.html"
    if proc.returncode != 0 or not index.exists():
        return None, f"tlparse exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"
    return index, None


def autotune_summary(lines):
    """From captured stderr: operations autotuned, candidate kernels benchmarked, benchmark seconds (chapter 6)."""
    found = [re.search(r"AUTOTUNE benchmarking takes ([\d.]+) seconds and ([\d.]+) seconds precompiling for (\d+) choices",
                       line) for line in lines]
    found = [m for m in found if m]
    return {"autotuned_ops": sum(line.startswith("AUTOTUNE ") for line in lines),
            "choices": sum(int(m.group(3)) for m in found),
            "benchmark_s": sum(float(m.group(1)) + float(m.group(2)) for m in found)}
