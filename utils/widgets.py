"""The widget panels: pick settings, press Run, watch the measurement join a live plot.

Every panel is a run_panel (controls, a Run button, an output); those that measure a speedup through
compare() are speedup_panels, which keep their rows and plot them.
"""
import ipywidgets as w
import matplotlib.pyplot as plt
from IPython.display import display

from .compare import compare, describe
from .plots import grouped_bars

MODES = ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
BACKENDS = ["inductor", "aot_eager", "eager"]


def compile_panel(make_model, make_inputs, sizes, device, workload="panel", min_run_time=0.5):
    """Dropdowns for mode, backend, fullgraph, dynamic and size; Run compiles, times and plots (chapter 1).

    make_model() builds a fresh model; make_inputs(size) builds its inputs for one of `sizes` ({label: size}).
    """
    controls = {"mode": w.Dropdown(options=MODES, value="default", description="mode"),
                "backend": w.Dropdown(options=BACKENDS, value="inductor", description="backend"),
                "dynamic": dynamic_dropdown(),
                "size": w.Dropdown(options=list(sizes), description="size"),
                "fullgraph": w.Checkbox(value=False, description="fullgraph")}

    def config(v):
        return {"mode": v["mode"], "backend": v["backend"], "fullgraph": v["fullgraph"], "dynamic": v["dynamic"]}

    def measure(v):
        return compare(make_model, make_inputs(sizes[v["size"]]), [config(v)], workload=f"{workload} {v['size']}",
                       device=device, min_run_time=min_run_time)

    return speedup_panel(controls, measure, lambda v: f"compiling and timing {config(v)} at {v['size']} ...",
                         "speedup over eager (your runs)")


def dynamic_dropdown():
    """torch.compile's dynamic: None (the default), False or True (chapters 1, 4)."""
    return w.Dropdown(options=[("None (default)", None), ("False", False), ("True", True)],
                      index=0, description="dynamic")  # value=None would mean "nothing selected"


def speedup_panel(controls, measure, describe, title):
    """run_panel whose Run measures: measure(values) -> compare() rows, added to a live speedup plot (chapters 1, 2, 4).

    The panel's `rows` holds the measurements made so far (eager once per workload), for reading back in code.
    """
    rows = []

    def work(values, out):
        new = measure(values)
        out.clear_output(wait=True)
        add_and_show(rows, new, title)

    panel = run_panel(controls, work, describe)
    panel.rows = rows
    return panel


def run_panel(controls, work, describe):
    """Controls, a Run button and an output: Run prints describe(values), then calls work(values, out) there (every panel).

    A failure is printed, not raised, so the panel stays alive; controls are laid out two to a row.
    """
    button = w.Button(description="Run", button_style="primary")
    out = w.Output()

    def on_run(_):
        values = {name: control.value for name, control in controls.items()}
        with out:
            out.clear_output(wait=True)
            print(describe(values))
            try:
                work(values, out)
            except Exception as error:  # a failed run is a result: say why and keep the panel alive
                print(f"failed: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}")

    button.on_click(on_run)
    items = [*controls.values(), button]
    panel = w.VBox([w.HBox(items[i:i + 2]) for i in range(0, len(items), 2)] + [out])
    display(panel)
    return panel


def add_and_show(rows, new, title):
    """Add a Run's measurements to a panel's rows (eager once per workload), plot them, print the new ones (chapter 1)."""
    for row in new:
        eager_known = any(r["workload"] == row["workload"] and r["variant"] == "eager" for r in rows)
        if row["variant"] != "eager" or not eager_known:
            rows.append(row)
    grouped_bars(rows, "speedup", title=title)
    plt.show()
    for r in new:
        detail = (f"{r['median_ms']:.3f} ms, compile {r['compile_s']:.1f} s, speedup {r['speedup']:.2f}x"
                  if r["status"] == "ok" else describe(r))
        print(f"{r['workload']:>20} {r['variant']:<32} {detail}")
