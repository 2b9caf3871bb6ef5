"""The widget panel: pick compile settings, press Run, watch the measurement join a live plot."""
import ipywidgets as w
import matplotlib.pyplot as plt
from IPython.display import display

from .compare import compare, describe
from .plots import grouped_bars

MODES = ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
BACKENDS = ["inductor", "aot_eager", "eager"]


def compile_panel(make_model, make_inputs, sizes, device, workload="panel", min_run_time=0.5):
    """Dropdowns for mode, backend, fullgraph, dynamic and size; Run compiles, times and plots (chapter 1).

    make_model() builds a fresh model; make_inputs(size) builds its inputs for one of `sizes`.
    """
    mode = w.Dropdown(options=MODES, value="default", description="mode")
    backend = w.Dropdown(options=BACKENDS, value="inductor", description="backend")
    fullgraph = w.Checkbox(value=False, description="fullgraph")
    dynamic = w.Dropdown(options=[("None (default)", None), ("False", False), ("True", True)],
                         index=0, description="dynamic")  # value=None would mean "nothing selected"
    size = w.Dropdown(options=list(sizes.items()), description="size")
    run = w.Button(description="Run", button_style="primary")
    out = w.Output()
    rows = []

    def on_run(_):
        config = {"mode": mode.value, "backend": backend.value,
                  "fullgraph": fullgraph.value, "dynamic": dynamic.value}
        with out:
            out.clear_output(wait=True)
            print(f"compiling and timing {config} at {size.label} ...")
            new = compare(make_model, make_inputs(size.value), [config], workload=f"{workload} {size.label}",
                          device=device, min_run_time=min_run_time)
            out.clear_output(wait=True)
            add_and_show(rows, new, "speedup over eager (your runs)")

    run.on_click(on_run)
    panel = w.VBox([w.HBox([mode, backend]), w.HBox([dynamic, size]), w.HBox([fullgraph, run]), out])
    panel.rows = rows  # the measurements made so far, for reading back in code
    display(panel)
    return panel


def run_panel(controls, work, describe):
    """Controls, a Run button and an output: Run prints describe(values), then calls work(values, out) there (chapters 3, 5, 8).

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
                print(f"failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}")

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
