"""Eager against compile configurations, one fresh model each, timed in alternating rounds (chapter 1)."""
import contextlib
import statistics
import time
import traceback

import torch
from torch._dynamo.utils import counters

from .compiler import cudagraph_step_begin, free_compiled, is_oom  # noqa: F401 (cudagraph_step_begin re-exported)
from .timing import OutOfTime, deadline, gpu_time_ms, quantiles, time_first_call, time_fn, time_interleaved

CUDA_GRAPH_MODES = {"reduce-overhead", "max-autotune"}
EAGER = {"compile": False}


def variant_name(config):
    """A short label: 'eager', a mode ('max-autotune'), or 'backend=aot_eager', plus '+fullgraph' etc. (chapter 1)."""
    if config.get("compile") is False:
        return "eager"
    if "backend" in config and not config.get("mode"):
        parts = [f"backend={config['backend']}"]
    else:
        parts = [config.get("mode") or "default"]
    if config.get("fullgraph"):
        parts.append("fullgraph")
    if config.get("dynamic") is not None:
        parts.append(f"dynamic={config['dynamic']}")
    return "+".join(parts)


def compile_kwargs(config):
    """The torch.compile arguments a configuration stands for; mode only applies to inductor (chapter 1)."""
    kwargs = {k: config[k] for k in ("backend", "fullgraph", "dynamic") if k in config}
    if config.get("backend", "inductor") == "inductor" and config.get("mode") not in (None, "default"):
        kwargs["mode"] = config["mode"]
    return kwargs


def unsupported_reason(config, device):
    """Why a configuration cannot run on this device, or None (chapter 1)."""
    if device == "cpu" and config.get("mode") in CUDA_GRAPH_MODES:
        return f"mode {config['mode']!r} uses CUDA graphs and needs a GPU"
    return None


def tolerance(dtype):
    """Largest absolute difference from eager we accept, by dtype (chapter 1)."""
    return {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-1}.get(dtype, 1e-3)


def max_abs_error(out, ref):
    """Largest absolute difference between two outputs (tensors or tuples of tensors) (chapter 1)."""
    if isinstance(out, (tuple, list)):
        return max(max_abs_error(o, r) for o, r in zip(out, ref))
    if hasattr(out, "logits"):
        out, ref = out.logits, ref.logits
    return (out.float() - ref.float()).abs().max().item()


def detach_copy(out):
    """A copy of an output that the next CUDA-graph replay cannot overwrite (chapter 1)."""
    if isinstance(out, (tuple, list)):
        return type(out)(detach_copy(o) for o in out)
    return out.detach().clone() if torch.is_tensor(out) else out


def forward(model, inputs):
    """The default workload: an inference forward pass (chapter 1)."""
    with torch.no_grad():
        return model(*inputs)


def row(status, reason=None, **fields):
    """One measurement row: status 'ok', 'failed' or 'skipped', with the reason when not ok (chapter 1)."""
    if status not in ("ok", "failed", "skipped", "unfinished"):
        raise ValueError(f"unknown status {status!r}")
    return {**fields, "status": status, **({"reason": reason} if reason else {})}


def describe(r):
    """A row's status as one line: 'ok', or 'failed: why' (chapter 1)."""
    return r["status"] + (f": {r['reason']}" if r.get("reason") else "")


def memory_baseline():
    """Start counting a variant's memory: reset the peak and return what is held now, in bytes (chapter 1)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def memory_added_gb(baseline):
    """Peak GB the variant added on top of its baseline (weights, activations, CUDA-graph pools) (chapter 1)."""
    if baseline is None:
        return None
    return (torch.cuda.max_memory_allocated() - baseline) / 1e9


def fresh(make_model, config):
    """A new model from make_model(), compiled as configured, with Dynamo's state reset first (chapter 1)."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = make_model()
    return model if config.get("compile") is False else torch.compile(model, **compile_kwargs(config))


def count_graph_breaks(make_model, inputs, run=forward):
    """Graphs and graph breaks Dynamo finds in one call, via torch._dynamo.explain (chapter 1)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make_model()
    explanation = torch._dynamo.explain(lambda *args: run(model, args))(*inputs)
    return explanation.graph_count, explanation.graph_break_count


def recount_model_breaks(rows, make_model, model_inputs):
    """Set compiled rows' graph_breaks to the model's own forward breaks, when `run` did more than a forward (chapter 1)."""
    _, breaks = count_graph_breaks(make_model, model_inputs)
    for r in rows:
        if r["variant"] != "eager" and r.get("status") == "ok":
            r["graph_breaks"] = breaks
    return rows


def measure_eager(make_model, inputs, *, run=forward, min_run_time=1.0):
    """The eager model, its output, and its row: median and spread of its step, GPU time, memory (chapter 1)."""
    baseline = memory_baseline()
    model = fresh(make_model, EAGER)
    _, out = time_first_call(lambda: run(model, inputs))
    timing = time_fn(lambda: run(model, inputs), min_run_time=min_run_time)
    return model, detach_copy(out), {
        "median_ms": timing.median_ms, "p10_ms": timing.p10_ms, "p90_ms": timing.p90_ms,
        "gpu_ms": gpu_time_ms(lambda: run(model, inputs)), "compile_s": 0.0,
        "peak_mem_gb": memory_added_gb(baseline), "speedup": 1.0, "speedup_lo": 1.0, "speedup_hi": 1.0,
        "graph_breaks": 0, "recompiles": 0, "max_abs_err": 0.0}


def measure_against(eager_model, make_model, inputs, config, *, run=forward, min_run_time=1.0, rounds=7,
                    seconds=None):
    """A fresh compiled model timed in rounds alternating with the eager one: the speedup with its spread (chapter 1).

    `speedup` is the median of the per-round ratios eager/compiled, `speedup_lo` and `speedup_hi`
    the smallest and largest; `eager_ms` is the eager step timed in those same rounds. The first
    call, which compiles, is timed on its own (`compile_s`). With `seconds`, a compile still running
    then raises OutOfTime (kept only for chapters not yet measured in parts).
    """
    baseline = memory_baseline()
    model = fresh(make_model, config)
    start = time.perf_counter()
    try:
        with deadline(seconds) if seconds is not None else contextlib.nullcontext():
            compile_s, out = time_first_call(lambda: run(model, inputs))
    except OutOfTime as stop:
        stop.compile_s = time.perf_counter() - start  # how long it had compiled: a lower bound on its compile
        raise
    out = detach_copy(out)
    graphs = counters["stats"]["unique_graphs"]
    timed = time_interleaved({"eager": lambda: run(eager_model, inputs), "compiled": lambda: run(model, inputs)},
                             rounds=rounds, min_run_time=min_run_time)
    ratios = timed.ratios("eager", "compiled")
    p10, median, p90 = quantiles(timed.ms["compiled"])
    result = {"median_ms": median, "p10_ms": p10, "p90_ms": p90,
              "eager_ms": timed.median_ms("eager"),
              "gpu_ms": gpu_time_ms(lambda: run(model, inputs), replay=config.get("mode") in CUDA_GRAPH_MODES),
              "compile_s": compile_s, "peak_mem_gb": memory_added_gb(baseline),
              "speedup": statistics.median(ratios), "speedup_lo": min(ratios), "speedup_hi": max(ratios),
              "rounds": rounds}
    return result, out, graphs


def seconds_left(time_limit_s, started):
    """What is left of `time_limit_s` seconds begun at perf_counter() `started`; None without a limit (chapter 2c)."""
    return None if time_limit_s is None else time_limit_s - (time.perf_counter() - started)


def failure_reason(error):
    """The last line of an exception, short enough for a table (chapter 1)."""
    if is_oom(error):
        return "out of GPU memory"
    return traceback.format_exception_only(type(error), error)[-1].strip()[:300]


def compare(make_model, inputs, configs, *, workload, device, run=forward, min_run_time=1.0, rounds=7, extra=None,
            time_limit_s=None):
    """Eager, then each configuration against it in alternating rounds: speedup with spread, compile s, memory, breaks, error (chapter 1).

    Every row has a status: 'ok', 'skipped' (with the reason: a CUDA-graph mode on a CPU) or
    'failed' (a compile error, out of memory): a failure is a result, and the sweep goes on.
    `time_limit_s` is the older way to bound a sweep (chapter 2c); chapters measured in parts
    leave time to the runner (utils.run_book).
    """
    started = time.perf_counter()
    rows = []
    try:
        eager_model, eager_out, eager_row = measure_eager(make_model, inputs, run=run, min_run_time=min_run_time)
    except Exception as error:
        if not is_oom(error):
            raise
        free_compiled()
        return [row("failed", failure_reason(error), workload=workload, variant="eager", **(extra or {}))]
    rows.append(row("ok", workload=workload, variant="eager", **(extra or {}), mode=None, backend=None,
                    fullgraph=False, dynamic=None, **eager_row))
    for config in [c for c in configs if c.get("compile") is not False]:
        fields = {"workload": workload, "variant": variant_name(config), **(extra or {}),
                  "mode": config.get("mode"), "backend": config.get("backend", "inductor"),
                  "fullgraph": bool(config.get("fullgraph")), "dynamic": config.get("dynamic")}
        reason = unsupported_reason(config, device)
        seconds = seconds_left(time_limit_s, started)
        if not reason and seconds is not None and seconds <= 0:
            reason = f"no time left of its {time_limit_s:.0f} s limit"
        if reason:
            rows.append(row("skipped", reason, **fields))
            continue
        compiled_s = None
        try:
            result, out, graphs = measure_against(eager_model, make_model, inputs, config, run=run,
                                                  min_run_time=min_run_time, rounds=rounds, seconds=seconds)
        except OutOfTime as stop:  # still compiling when its time ran out: a lower bound on its compile is a result
            if seconds is None:  # not this limit's: an enclosing deadline's, for its caller
                raise
            compiled_s = stop.compile_s
        except Exception as error:  # a compile error or out of memory is a result, not the end of the sweep
            free_compiled()
            rows.append(row("failed", failure_reason(error), **fields))
            continue
        if compiled_s is not None:  # outside the handler: the interrupted compile's frames can be freed now
            free_compiled()
            rows.append(row("unfinished", f"still compiling after {compiled_s:.0f} s, when its time limit ran out",
                            **fields, compile_s_at_least=compiled_s))
            continue
        graph_count, breaks = count_graph_breaks(make_model, inputs, run)
        rows.append(row("ok", **fields, **result, graph_breaks=breaks, recompiles=max(graphs - graph_count, 0),
                        max_abs_err=max_abs_error(out, eager_out)))
    del eager_model
    free_compiled()
    return rows


def break_even_calls(compile_s, eager_ms, compiled_ms):
    """Calls after which compiling has paid for itself; None when compiled is not faster (chapter 1)."""
    saved_ms = eager_ms - compiled_ms
    return None if saved_ms <= 0 else compile_s * 1e3 / saved_ms
