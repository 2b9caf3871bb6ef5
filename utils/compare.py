"""Eager against compile configurations, one fresh model each, every failure reported (chapter 1)."""
import contextlib
import time
import traceback

import torch
from torch._dynamo.utils import counters

from .llm import free_compiled
from .timing import OutOfTime, deadline, time_fn, time_first_call

CUDA_GRAPH_MODES = {"reduce-overhead", "max-autotune"}


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


EAGER = {"compile": False}


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


def measure(make_model, inputs, config, *, run=forward, min_run_time=1.0, seconds=None):
    """A fresh model, compiled as configured and timed; OutOfTime if compiling past `seconds` (chapters 1 and 2c)."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = make_model()
    if config.get("compile") is not False:
        model = torch.compile(model, **compile_kwargs(config))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        with deadline(seconds) if seconds is not None else contextlib.nullcontext():
            compile_s, out = time_first_call(lambda: run(model, inputs))
    except OutOfTime as stop:
        stop.compile_s = time.perf_counter() - start  # how long it had compiled: a lower bound on its compile
        raise
    out = detach_copy(out)
    timing = time_fn(lambda: run(model, inputs), min_run_time=min_run_time)
    graphs = counters["stats"]["unique_graphs"]
    return {
        "median_ms": timing.median_ms, "p10_ms": timing.p10_ms, "p90_ms": timing.p90_ms,
        "compile_s": compile_s if config.get("compile") is not False else 0.0,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
        "graphs": graphs,
    }, out


def cudagraph_step_begin():
    """Tell CUDA graphs (reduce-overhead) a new step starts; a no-op without a GPU or while traced (chapter 1)."""
    if torch.cuda.is_available() and not torch.compiler.is_compiling():
        torch.compiler.cudagraph_mark_step_begin()


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
    for row in rows:
        if row["variant"] != "eager" and row.get("status") == "ok":
            row["graph_breaks"] = breaks
    return rows


def seconds_left(time_limit_s, started):
    """What is left of `time_limit_s` seconds begun at perf_counter() `started`; None without a limit (chapter 2c)."""
    return None if time_limit_s is None else time_limit_s - (time.perf_counter() - started)


def compare(make_model, inputs, configs, *, workload, device, run=forward, min_run_time=1.0, extra=None,
            time_limit_s=None):
    """Eager, then each configuration: median, spread, speedup, compile s, memory, breaks, error (chapters 1 and 2c).

    With `time_limit_s`, each compile gets what is left of it, counted from the call: one still
    compiling then is stopped and reported unfinished, with the seconds it ran (`compile_s_at_least`),
    and the configurations after it are skipped. Eager is always measured.
    """
    started = time.perf_counter()
    rows, eager_ms, eager_out = [], None, None
    for config in [EAGER] + [c for c in configs if c.get("compile") is not False]:
        row = {"workload": workload, "variant": variant_name(config), **(extra or {}),
               "mode": config.get("mode"), "backend": None if config is EAGER else config.get("backend", "inductor"),
               "fullgraph": bool(config.get("fullgraph")), "dynamic": config.get("dynamic")}
        reason = unsupported_reason(config, device)
        seconds = None if config is EAGER else seconds_left(time_limit_s, started)
        if not reason and seconds is not None and seconds <= 0:
            reason = f"no time left of its {time_limit_s:.0f} s limit"
        if reason:
            rows.append({**row, "status": f"skipped: {reason}"})
            continue
        compiled_s = None
        try:
            result, out = measure(make_model, inputs, config, run=run, min_run_time=min_run_time, seconds=seconds)
        except OutOfTime as stop:  # still compiling when its time ran out: a lower bound on its compile is a result
            if seconds is None:  # not this limit's: an enclosing deadline's, for its caller
                raise
            compiled_s = stop.compile_s
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            rows.append({**row, "status": "failed: out of GPU memory"})
            continue
        except Exception as error:  # a compile error is a result, not the end of the sweep
            last = traceback.format_exception_only(type(error), error)[-1].strip()
            rows.append({**row, "status": f"failed: {last[:300]}"})
            continue
        if compiled_s is not None:  # outside the handler: the interrupted compile's frames can be freed now
            free_compiled()
            rows.append({**row, "status": f"unfinished: still compiling after {compiled_s:.0f} s, "
                                          "when its time limit ran out", "compile_s_at_least": compiled_s})
            continue
        graphs = result.pop("graphs")
        if config is EAGER:
            eager_ms, eager_out = result["median_ms"], out
            graph_count, breaks, graphs = 0, 0, 0
        else:
            graph_count, breaks = count_graph_breaks(make_model, inputs, run)
        rows.append({**row, "status": "ok", **result,
                     "speedup": eager_ms / result["median_ms"] if eager_ms else None,
                     "graph_breaks": breaks,
                     "recompiles": max(graphs - graph_count, 0),
                     "max_abs_err": max_abs_error(out, eager_out) if eager_out is not None else None})
    return rows


def break_even_calls(compile_s, eager_ms, compiled_ms):
    """Calls after which compiling has paid for itself; None when compiled is not faster (chapter 1)."""
    saved_ms = eager_ms - compiled_ms
    return None if saved_ms <= 0 else compile_s * 1e3 / saved_ms
