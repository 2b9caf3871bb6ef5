"""When compiling pays for itself: the arithmetic, the book's measured workloads as presets, and their plot (chapter 7).

A compile is paid once, up front; each call then saves eager_ms - compiled_ms. The calls after which
the savings repay the compile are `compile_s * 1000 / (eager_ms - compiled_ms)`
(utils.break_even_calls), and never when compiled is not faster.
"""
from pathlib import Path

from .benchmarks import ResultsError, is_eager, read_results
from .compare import break_even_calls

NUMBERS = ("median_ms", "eager_ms", "speedup", "speedup_lo", "speedup_hi", "compile_s", "warm_compile_s")
DEBUG_BACKENDS = ("eager", "aot_eager")  # backends that generate no code: no recipe to deploy
COLD_WARM = " cold/warm"  # chapter 1's row of one variant's cold and warm compile, e.g. "default cold/warm"
COLUMNS = ("chapter", "workload", "variant", "eager_ms", "compiled_ms", "speedup", "cold_s", "warm_s",
           "calls_cold", "calls_warm")


def calls_to_repay(upfront_s, eager_ms, compiled_ms):
    """Calls after which `upfront_s` seconds are repaid: 0 if none are owed, None if compiled is not faster (chapter 7)."""
    if upfront_s is None or compiled_ms >= eager_ms:
        return None
    return 0.0 if upfront_s <= 0 else break_even_calls(upfront_s, eager_ms, compiled_ms)


def job_seconds(calls, step_ms, upfront_s=0.0):
    """Seconds a job of `calls` calls takes: what it pays up front, then every call (chapter 7)."""
    return upfront_s + calls * step_ms / 1e3


def calls_text(calls, measured=True):
    """A break-even as the tables show it: '12,345', 'never' (compiled not faster), '-' (not measured) (chapter 7)."""
    if not measured:
        return "-"
    return "never" if calls is None else f"{calls:,.0f}"


def break_even_text(calls, unit="calls"):
    """A break-even as the prose says it: '2,105 calls', or 'never (compiled is not faster)' (chapter 7)."""
    return "never (compiled is not faster)" if calls is None else f"{calls:,.0f} {unit}"


def eager_ms_of(row):
    """The eager step a compiled row was measured against: its eager_ms (same rounds), else median_ms x speedup (chapter 7)."""
    if row.get("eager_ms"):
        return row["eager_ms"]
    return row["median_ms"] * row["speedup"] if row.get("speedup") else None


def _checked(path):
    """A results file's rows, each measured number a number; ResultsError naming the file and row if not (chapter 7)."""
    rows = read_results(path)["measurements"]
    for i, row in enumerate(rows):
        for key in NUMBERS:
            value = row.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ResultsError(f"{path}: measurement {i} ({row['workload']}, {row['variant']}): "
                                   f"{key} is {value!r}, not a number")
    return rows


def preset(chapter, workload, variant, eager_ms, compiled_ms, cold_s, warm_s=None, **extra):
    """One preset of the calculator: step times, up-front seconds and the calls that repay them (chapter 7)."""
    return {"chapter": chapter, "workload": workload, "variant": variant, "eager_ms": eager_ms,
            "compiled_ms": compiled_ms, "cold_s": cold_s, "warm_s": warm_s, **extra,
            "calls_cold": calls_to_repay(cold_s, eager_ms, compiled_ms),
            "calls_warm": calls_to_repay(warm_s, eager_ms, compiled_ms)}


def file_presets(path):
    """Every compiled row of one results file that has a step time, an eager baseline and a compile time (chapter 7)."""
    path = Path(path)
    rows = _checked(path)
    chapter = path.stem.split("_")[0].lstrip("0")
    compiles = {(r["workload"], r["variant"].removesuffix(COLD_WARM)): r for r in rows
                if r["variant"].endswith(COLD_WARM) and r.get("warm_compile_s") is not None}
    out = []
    for r in rows:
        if (r.get("status", "ok") != "ok" or is_eager(r) or r.get("backend") in DEBUG_BACKENDS
                or not r.get("median_ms") or not r.get("compile_s")):
            continue
        eager_ms = eager_ms_of(r)
        if eager_ms is None:
            continue
        both = compiles.get((r["workload"], r["variant"]), r)  # the cold and warm compile, where measured apart
        out.append(preset(chapter, r["workload"], r["variant"], eager_ms, r["median_ms"], both["compile_s"],
                          both.get("warm_compile_s"), batch=r.get("batch"), speedup=r.get("speedup"),
                          speedup_lo=r.get("speedup_lo"), speedup_hi=r.get("speedup_hi"), file=path.name))
    return out


def soonest_repaid(rows):
    """Of one workload's presets, the one repaid soonest from a cold start; if none is, the fastest (chapter 7)."""
    repaid = [r for r in rows if r["calls_cold"] is not None]
    if repaid:
        return min(repaid, key=lambda r: r["calls_cold"])
    return min(rows, key=lambda r: r["compiled_ms"] / r["eager_ms"])


def measured_presets(folder, exclude=()):
    """Presets from a GPU's results files (results/<gpu>/*.json): per workload, the variant repaid soonest (chapter 7).

    Variants with a warm compile measured are kept as well; `exclude` names chapters to leave out
    ("07_deployment"). A missing folder, an empty one, or a file that is not a results file raises
    ResultsError naming it.
    """
    folder = Path(folder)
    files = sorted(p for p in folder.glob("*.json") if p.stem not in exclude)
    if not files:
        raise ResultsError(f"{folder}: no results files (<chapter>.json) to take the presets from")
    by_workload = {}
    for path in files:
        for p in file_presets(path):
            by_workload.setdefault((p["file"], p["workload"], p["batch"]), []).append(p)
    out = []
    for rows in by_workload.values():
        best = soonest_repaid(rows)
        out += [r for r in rows if r is best or r["warm_s"] is not None]
    return out


def server_presets(starts, restarts, serve_rows, concurrency):
    """This chapter's LM server as presets: p50 per request in the same rounds, start seconds beyond eager's (chapter 7).

    cold_s is a first start (an empty cache; for AOTInductor, building the package), warm_s a restart
    after a kill (the warm cache and Mega-Cache; for AOTInductor, loading the package), each less the
    eager server's start.
    """
    def find(rows, **match):
        return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)

    eager_start, eager = find(starts, variant="eager"), find(serve_rows, variant="eager", concurrency=concurrency)
    out = []
    for mode, label in (("compiled", "torch.compile"), ("cudagraphs", "torch.compile, CUDA graphs"),
                        ("aoti", "AOTInductor package")):
        first, again = find(starts, variant=mode), find(restarts, variant=mode)
        served = find(serve_rows, variant=mode, concurrency=concurrency)
        if not (eager_start and eager and first and served and eager["p50_ms"] and served["p50_ms"]):
            continue
        out.append(preset("7", f"LM server, concurrency {concurrency}", label, eager["p50_ms"], served["p50_ms"],
                          first["ready_s"] - eager_start["ready_s"],
                          again["ready_s"] - eager_start["ready_s"] if again else None,
                          speedup=served.get("speedup"), speedup_lo=served.get("speedup_lo"),
                          speedup_hi=served.get("speedup_hi"), file="this run"))
    return out


def table_rows(presets):
    """Presets with their break-evens as text, for utils.show_table(rows, COLUMNS) (chapter 7)."""
    return [{**p, "calls_cold": calls_text(p["calls_cold"]),
             "calls_warm": calls_text(p["calls_warm"], p["warm_s"] is not None)} for p in presets]


def plot_totals(ax, eager_ms, compiled_ms, upfront, calls):
    """Total seconds against calls: eager, and compiled after each up-front cost in `upfront` ({label: s}) (chapter 7)."""
    ns = [calls * k / 200 for k in range(201)]
    ax.plot(ns, [job_seconds(n, eager_ms) for n in ns], label="eager", color="black")
    for label, seconds in upfront.items():
        if seconds is None:
            continue
        ax.plot(ns, [job_seconds(n, compiled_ms, seconds) for n in ns], label=f"compiled, {label}")
        repaid = calls_to_repay(seconds, eager_ms, compiled_ms)
        if repaid is not None and repaid <= calls:
            ax.plot([repaid], [job_seconds(repaid, eager_ms)], "o", color="grey")
    ax.set_xlabel("calls")
    ax.set_ylabel("total seconds")
    ax.legend(fontsize="small")
    return ax
