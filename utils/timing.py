"""Timing that is honest on GPUs and CPUs, built on torch.utils.benchmark."""
import contextlib
import signal
import threading
import time
from dataclasses import dataclass

import torch
from torch.utils.benchmark import Timer


@dataclass
class Timing:
    """Median and spread (10th and 90th percentiles) of many timed blocks, in milliseconds."""
    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int


def sync():
    """Wait for queued GPU work, so a wall clock measures it (chapter 1)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_fn(fn, *, min_run_time=1.0, warmup=3, blocks=20, min_blocks=5):
    """Steady-state time of fn(): warm-up, then up to `blocks` timed blocks of torch.utils.benchmark (chapter 1).

    Fast functions get `blocks` blocks of many calls sharing about `min_run_time`; slow ones (a
    call near min_run_time or longer) get `min_blocks` blocks of one call, so a spread is always
    measured without spending minutes on a multi-second call.
    """
    for _ in range(warmup):
        fn()
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    one_call_s = max(timer.timeit(1).mean, 1e-9)
    # Timer.timeit runs two untimed calls before each timed block: count them in the budget
    affordable = int(min_run_time / (3 * one_call_s))
    blocks = min(blocks, max(min_blocks, affordable))
    calls_per_block = max(1, int(min_run_time / blocks / one_call_s))
    p10, p50, p90 = quantiles([_block_ms(timer, calls_per_block) for _ in range(blocks)])
    return Timing(median_ms=p50, p10_ms=p10, p90_ms=p90, runs=calls_per_block * blocks)


def _block_ms(timer, calls):
    """Mean milliseconds per call over one timed block of `calls` calls."""
    return timer.timeit(calls).mean * 1e3


def quantiles(values, qs=(0.1, 0.5, 0.9)):
    """The given quantiles of a list of numbers (chapter 1)."""
    t = torch.tensor(values, dtype=torch.float64)
    return torch.quantile(t, torch.tensor(qs, dtype=torch.float64)).tolist()


@dataclass
class Interleaved:
    """Per-round milliseconds of each function timed in alternating rounds, and their ratios (chapter 1)."""
    ms: dict
    rounds: int

    def median_ms(self, name):
        """Median over the rounds of one function's per-call time (chapter 1)."""
        return quantiles(self.ms[name], (0.5,))[0]

    def ratios(self, slower, faster):
        """Per-round ratios slower/faster: how many times faster `faster` was in each round (chapter 1)."""
        return [a / b for a, b in zip(self.ms[slower], self.ms[faster])]


def time_interleaved(fns, *, rounds=7, min_run_time=1.0, warmup=3):
    """Time several functions in alternating rounds (A B A B ...), so drift hits each alike (chapter 1).

    Each round times every function for a block of about min_run_time / rounds seconds. A speedup
    is then the median of the per-round ratios, and its spread is the spread of those ratios: a
    host that is busier in one minute than the next moves both sides of a round together.
    """
    timers, calls = {}, {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        timers[name] = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        one_call_s = max(timers[name].timeit(1).mean, 1e-9)
        calls[name] = max(1, int(min_run_time / rounds / one_call_s))
    ms = {name: [] for name in fns}
    for _ in range(rounds):
        for name in fns:
            ms[name].append(_block_ms(timers[name], calls[name]))
    return Interleaved(ms=ms, rounds=rounds)


def _event_ms(fn, calls):
    """Milliseconds per call of fn() between two CUDA events, calls back to back."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def gpu_time_ms(fn, calls=20, replay=False):
    """The GPU's own time per call of fn(), from a CUDA-graph replay of it; None on a CPU or if it cannot be captured (chapter 1).

    Captured into a CUDA graph, the step's kernels run back to back with no host in between:
    what the step would take if launching were free, the floor that wall-clock time approaches
    as host overhead goes. With `replay=True` fn already replays a CUDA graph (reduce-overhead)
    and is timed as it is. (The profiler would give kernel times too, but it slows every later
    kernel launch in the process, which would bias the timings that follow.)
    """
    if not torch.cuda.is_available():
        return None
    if replay:
        return _event_ms(fn, calls)
    graph = torch.cuda.CUDAGraph()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as capture wants
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # a step that syncs with the host, or a CPU scalar: no graph, no floor
        torch.cuda.synchronize()
        return None
    ms = _event_ms(graph.replay, calls)
    del graph
    return ms


def time_first_call(fn):
    """Seconds taken by one call of fn(), GPU work included: for a compiled fn, its compile time (chapter 1)."""
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - start, out


class Budget:
    """Seconds left of a run's time budget, so optional measurements are skipped with a message (chapters 2 and 3).

    (kept for chapter 2c/5 until it measures through utils.runs)
    """

    def __init__(self, seconds):
        self.seconds, self.start = seconds, time.perf_counter()

    def spent(self):
        """Seconds since the budget started (chapters 2 and 3)."""
        return time.perf_counter() - self.start

    def allows(self, seconds):
        """Whether `seconds` more work still fits in the budget (chapters 2 and 3)."""
        return self.spent() + seconds <= self.seconds


class OutOfTime(BaseException):
    """Raised by `deadline` in a block that ran too long; a BaseException, so `except Exception` lets it through (chapter 5c)."""


@contextlib.contextmanager
def deadline(seconds, every=5.0):
    """Raise OutOfTime in the block after `seconds`, and again every `every` s until it ends (chapter 5c).

    For a compile that may not finish in a run's time. It uses SIGALRM, so only in the main thread
    of a POSIX process (a notebook's cells run there). The repeat is for when it is swallowed: by
    code that catches it, or by Python itself when the alarm lands in a weakref callback or __del__.
    """
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        raise RuntimeError("utils.deadline needs the main thread of a POSIX process (it uses SIGALRM)")

    def on_alarm(signum, frame):
        raise OutOfTime(f"still running after {seconds:.1f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3), every)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
