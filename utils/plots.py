"""The book's plots: grouped bars of what was measured, and time against calls."""
import matplotlib.pyplot as plt


def grouped_bars(rows, value="speedup", group="workload", ax=None, title=None, ylabel=None):
    """Bars of `value` per variant, one colour per `group`, with the rounds' range where rows have one; failed rows are left out (chapter 1)."""
    ok = [r for r in rows if r.get("status", "ok") == "ok" and r.get(value) is not None]
    groups = list(dict.fromkeys(r[group] for r in ok))
    variants = list(dict.fromkeys(r["variant"] for r in ok))
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / max(len(groups), 1)
    for i, g in enumerate(groups):
        by_variant = {r["variant"]: r for r in ok if r[group] == g}
        present = [v for v in variants if v in by_variant]
        xs = [j + i * width for j, v in enumerate(variants) if v in by_variant]
        heights = [by_variant[v][value] for v in present]
        spread = None
        if all(by_variant[v].get(f"{value}_lo") is not None for v in present):  # the range of the rounds
            spread = [[h - by_variant[v][f"{value}_lo"] for v, h in zip(present, heights)],
                      [by_variant[v][f"{value}_hi"] - h for v, h in zip(present, heights)]]
        ax.bar(xs, heights, width, label=str(g), yerr=spread, capsize=3 if spread else 0)
    ax.set_xticks([j + width * (len(groups) - 1) / 2 for j in range(len(variants))])
    ax.set_xticklabels(variants, rotation=20, ha="right")
    if value == "speedup":
        ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_ylabel(ylabel or value)
    ax.set_title(title or "")
    if len(groups) > 1:
        ax.legend(fontsize="small")
    ax.figure.tight_layout()
    return ax


def cumulative_time(compile_s, eager_ms, compiled_ms, calls, ax=None):
    """Total seconds after n calls, eager vs compiled (compile time up front) (chapter 1)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    ns = range(0, calls + 1, max(calls // 200, 1))
    ax.plot(ns, [n * eager_ms / 1e3 for n in ns], label="eager")
    ax.plot(ns, [compile_s + n * compiled_ms / 1e3 for n in ns], label="compiled (compile first)")
    ax.set_xlabel("calls")
    ax.set_ylabel("total seconds")
    ax.legend()
    ax.figure.tight_layout()
    return ax
