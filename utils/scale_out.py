"""Scaling out (chapter 8), the notebook side: launch torchrun, read its rows, plot them, a panel.

What runs inside each process lives in utils/scale_out_worker.py (its docstring has the command line
and the compile modes); its names are re-exported here, so `scale_out.prepare`, `scale_out.PRESETS`
and the rest read as before. `python -m utils.scale_out` still runs the worker's command line.
"""
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .env import REPO_ROOT, child_python_path
from .scale_out_worker import (COMPILE_MODES, STRATEGIES, check_processes, configurations, describe, main,
                               resolve_device, sizes_of)
from .scale_out_worker import ForwardBackward, PRESETS, count_params_m, prepare, wrap_fsdp2  # noqa: F401 (chapter 8)


# --- launch torchrun, read the rows -----------------------------------------------------------------

def cpu_cores():
    """CPU cores this process may use (chapter 8)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class LaunchError(RuntimeError):
    """torchrun failed or timed out; the message holds the command and the end of its output (chapter 8)."""


def torchrun_command(nproc, out, *, preset="smoke", strategies="ddp", compiles="none,default", device="auto",
                     extra=()):
    """The command `launch` runs: python -m torch.distributed.run --standalone ... -m utils.scale_out_worker ... (chapter 8)."""
    join = lambda v: v if isinstance(v, str) else ",".join(v)  # noqa: E731
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "utils.scale_out_worker", "--preset", preset, "--strategy", join(strategies),
            "--compile", join(compiles), "--device", device, "--out", str(out), *map(str, extra)]


def launch(nproc, *, preset="smoke", strategies="ddp", compiles="none,default", device="auto", extra=(),
           timeout=900, env=None):
    """Run the configurations in nproc processes under torchrun; returns the rows, or raises LaunchError (chapter 8).

    Checks its arguments first (clear ValueErrors). The subprocess inherits the environment
    (TORCHINDUCTOR_CACHE_DIR included); on the CPU each process gets an equal share of the cores
    (OMP_NUM_THREADS) unless the caller set it. torchrun --standalone picks a free port.
    """
    sizes_of(preset)
    configurations(strategies, compiles)
    check_processes(nproc, resolve_device(device))
    run_env = {**os.environ, **(env or {})}
    run_env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_cores() // nproc)))
    run_env["PYTHONPATH"] = child_python_path(run_env)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        cmd = torchrun_command(nproc, out, preset=preset, strategies=strategies, compiles=compiles,
                               device=device, extra=extra)
        shown = "torchrun " + " ".join(cmd[3:]).replace(str(out), "rows.jsonl")
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)  # its own process group: torchrun and workers
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            stdout, stderr = proc.communicate()
            raise LaunchError(f"torchrun timed out after {timeout} s: {shown}\n{tail(stdout, stderr)}") from None
        rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
        if proc.returncode != 0 or not rows:
            raise LaunchError(f"torchrun exited {proc.returncode}: {shown}\n{tail(stdout, stderr)}")
        return rows


def scaling_efficiency(rows):
    """Add scaling_efficiency = tokens/s per process at N / at 1 process, same strategy and compile (chapter 8).

    That is N-process throughput / (N x 1-process throughput): 1.0 is perfect weak scaling.
    """
    ok = [r for r in rows if r.get("status") == "ok"]
    for row in ok:
        base = next((r for r in ok if r["world_size"] == 1 and r["strategy"] == row["strategy"]
                     and r["compile"] == row["compile"] and r["device"] == row["device"]), None)
        row["scaling_efficiency"] = row["tok_s_per_gpu"] / base["tok_s_per_gpu"] if base else None
    return rows


def launch_panel(max_procs, *, preset, device, timeout=900):
    """Dropdowns for strategy, compile mode and processes; Run launches torchrun and plots tokens/s (chapter 8)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from .plots import grouped_bars
    from .widgets import run_panel

    controls = {"strategy": w.Dropdown(options=list(STRATEGIES), value="ddp", description="strategy"),
                "compile": w.Dropdown(options=list(COMPILE_MODES), value="default", description="compile"),
                "procs": w.Dropdown(options=list(range(1, max_procs + 1)), value=max_procs, description="processes")}
    rows = []

    def work(v, out):
        try:
            new = launch(v["procs"], preset=preset, strategies=v["strategy"], compiles=v["compile"],
                         device=device, timeout=timeout)
        except LaunchError as error:  # its message carries the workers' output: show all of it
            print(error)
            return
        rows.extend(new)
        out.clear_output(wait=True)
        grouped_bars(rows, "tok_s_per_gpu", title="tokens/s per process (your runs)", ylabel="tokens/s")
        plt.show()
        for row in new:
            print(describe(row))

    panel = run_panel(controls, work, lambda v: f"launching torchrun: {v['procs']} process(es), {v['strategy']}, "
                                                f"compile {v['compile']} ...")
    panel.rows = rows
    return panel


def stop(proc, grace_s=45):
    """End a launched torchrun: SIGTERM to its process group, then SIGKILL (chapter 8).

    Its workers run in sessions of their own; torchrun forwards the SIGTERM to them and waits up
    to 30 s before it kills them itself, so the grace period is longer than that.
    """
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def tail(stdout, stderr, lines=40):
    """The end of a run's output for an error message: without torchrun's own traceback and CUDA_HOME notices (chapter 8)."""
    text = [line for line in "\n".join(s or "" for s in (stdout, stderr)).splitlines() if "cpp_extension" not in line]
    keep, skipping = [], False
    for i, line in enumerate(text):
        if line.startswith("Traceback") and any("distributed/run.py" in t for t in text[i + 1:i + 6]):
            skipping = True  # the launcher's traceback says only that a worker failed: the worker said why
        if skipping:
            skipping = "ChildFailedError" not in line
            continue
        keep.append(line)
    return "\n".join(keep[-lines:])


if __name__ == "__main__":
    main()
