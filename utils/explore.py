"""Explorers: charts of measured rows that the reader filters in the browser, with no kernel.

An explorer is a Vega-Lite chart whose data are a chapter's rows (the dicts of
results/<gpu>/<chapter>.json "measurements"); a menu bound to a Vega-Lite parameter picks a batch,
a workload, a chapter or a GPU, and the bars and the numbers beside them follow. It is plain HTML
and JavaScript, so it works on the book's static site, where the ipywidgets panels (which need a
kernel) do not. The site serves Vega, Vega-Lite and vega-embed itself (book/_vendor/vega/, loaded
by book/_ext/explorers.py); in Jupyter or Colab the chart fetches the same versions from a CDN.

    utils.explorer(mode_rows, pick="batch")           # bars of speedup per variant, pick a batch
    utils.explore.scatter_explorer(rows, x="compile_s", y="speedup", pick="chapter", color="chapter")
"""
import hashlib
import html
import itertools
import json

from .tables import cell_text

# The versions the Makefile vendors for the site (tests/test_explore.py checks that they agree).
VEGA_VERSIONS = {"vega": "6.4.0", "vega-lite": "6.5.0", "vega-embed": "7.3.0"}
SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"
CDN = "https://cdn.jsdelivr.net/npm/"
ALL = "all"
UNITS = {"speedup": "x", "median_ms": " ms", "gpu_ms": " ms", "compile_s": " s", "peak_mem_gb": " GB"}
TITLES = {"speedup": "speedup over eager (x)", "median_ms": "median ms per step", "compile_s": "compile s",
          "peak_mem_gb": "peak memory GB", "eager_ms": "eager ms per step", "gpu_ms": "GPU ms per step"}
TOOLTIP = ("median_ms", "gpu_ms", "compile_s", "peak_mem_gb")
_ids = itertools.count()


def measured(rows, value):
    """The rows that measured `value`: status ok and a number there (chapter 1)."""
    return [r for r in rows if r.get("status", "ok") == "ok" and isinstance(r.get(value), (int, float))
            and not isinstance(r.get(value), bool)]


def as_option(value):
    """A value of a picked field as the menu shows it: text, a dash for a missing one (chapter 1)."""
    return "-" if value is None else str(value)


def options(rows, field):
    """The distinct values of `field` in the rows, in the order they first appear (chapter 1)."""
    return list(dict.fromkeys(as_option(r.get(field)) for r in rows))


def bar_label(row, value):
    """The numbers shown beside a bar: the value with its spread, and the step time (chapter 1)."""
    text = cell_text(row, value) if value == "speedup" else cell_text(row, value) + UNITS.get(value, "")
    if value != "median_ms" and row.get("median_ms") is not None:
        text += f" · {cell_text(row, 'median_ms')} ms"
    return text


def _picks(pick):
    """`pick` as a tuple of field names: one name, or several for several menus (chapter 1)."""
    return (pick,) if isinstance(pick, str) else tuple(pick or ())


def _params(rows, picks, all_option):
    """One Vega-Lite parameter per picked field, bound to a menu, with a filter for each (chapter 1)."""
    params, filters = [], []
    for i, field in enumerate(picks):
        choices = options(rows, field)
        if all_option and len(choices) > 1:
            choices = [ALL] + choices
        params.append({"name": f"pick{i}", "value": choices[0] if choices else None,
                       "bind": {"input": "select", "options": choices, "name": f"{field} "}})
        filters.append({"filter": f"pick{i} == '{ALL}' || datum.p{i} == pick{i}" if all_option
                        else f"datum.p{i} == pick{i}"})
    return params, filters


def _tooltip(rows, fields):
    """Tooltip entries for the fields some row has, and the row data they read (chapter 1)."""
    present = [f for f in fields if any(r.get(f) is not None for r in rows)]
    return ([{"field": f"t{i}", "type": "nominal", "title": TITLES.get(f, f.replace("_", " "))}
             for i, f in enumerate(present)],
            lambda row: {f"t{i}": cell_text(row, f) for i, f in enumerate(present)})


def bar_spec(rows, pick="batch", category="variant", value="speedup", title=None, all_option=False,
             tooltip=TOOLTIP, width=380):
    """A Vega-Lite spec: bars of `value` per `category` with their spread, filtered by menus (chapter 1)."""
    rows = measured(rows, value)
    picks = _picks(pick)
    params, filters = _params(rows, picks, all_option)
    tips, tip_values = _tooltip(rows, tooltip)
    values = []
    for row in rows:
        lo, hi = row.get(f"{value}_lo"), row.get(f"{value}_hi")
        if lo is None or hi is None:  # no spread: a rule of no length (an empty field would warn in the console)
            lo = hi = row[value]
        item = {"cat": as_option(row.get(category)), "val": row[value], "lo": lo, "hi": hi,
                "end": max(row[value], hi), "label": bar_label(row, value),
                "base": str(row.get("variant", "")).startswith("eager")}
        item.update({f"p{i}": as_option(row.get(f)) for i, f in enumerate(picks)})
        item.update(tip_values(row))
        values.append(item)
    x_title = TITLES.get(value, value.replace("_", " "))
    x = {"field": "val", "type": "quantitative", "title": x_title}
    layers = [
        {"mark": {"type": "bar", "tooltip": True},
         "encoding": {"x": x, "color": {"condition": {"test": "datum.base", "value": "#9e9e9e"}, "value": "#4c78a8"},
                      "tooltip": [{"field": "cat", "type": "nominal", "title": category},
                                  {"field": "label", "type": "nominal", "title": value}] + tips}},
        {"mark": {"type": "rule", "color": "black"},
         "encoding": {"x": {"field": "lo", "type": "quantitative"}, "x2": {"field": "hi"}}},
        {"mark": {"type": "text", "align": "left", "dx": 4, "fontSize": 11},
         "encoding": {"x": {"field": "end", "type": "quantitative"}, "text": {"field": "label"}}},
    ]
    if value == "speedup":  # the eager line
        layers.append({"mark": {"type": "rule", "strokeDash": [4, 3], "color": "grey"},
                       "encoding": {"x": {"datum": 1}}})
    return {"$schema": SCHEMA, "title": title or x_title, "background": "white",
            "data": {"values": values}, "params": params, "transform": filters, "width": width,
            "height": {"step": 22},
            "encoding": {"y": {"field": "cat", "type": "nominal", "sort": None, "title": None,
                               "axis": {"labelLimit": 260}}},
            "layer": layers}


def scatter_spec(rows, x="compile_s", y="speedup", pick="chapter", color="chapter", shape=None, label="workload",
                 title=None, all_option=True, log_x=True, tooltip=TOOLTIP, width=460, height=300):
    """A Vega-Lite spec: one point per row, `y` against `x`, filtered by menus (benchmarks page)."""
    rows = [r for r in measured(measured(rows, y), x) if not (log_x and r[x] <= 0)]
    picks = _picks(pick)
    params, filters = _params(rows, picks, all_option)
    tips, tip_values = _tooltip(rows, [f for f in tooltip if f not in (x, y)])
    values = []
    for row in rows:
        item = {"x": row[x], "y": row[y], "c": as_option(row.get(color)), "name": as_option(row.get(label)),
                "variant": as_option(row.get("variant")), "yl": bar_label(row, y) if y == "speedup" else cell_text(row, y),
                "xl": cell_text(row, x) + UNITS.get(x, "")}
        if shape:
            item["s"] = as_option(row.get(shape))
        item.update({f"p{i}": as_option(row.get(f)) for i, f in enumerate(picks)})
        item.update(tip_values(row))
        values.append(item)
    encoding = {
        "x": {"field": "x", "type": "quantitative", "title": TITLES.get(x, x.replace("_", " ")),
              "scale": {"type": "log"} if log_x else {}},
        "y": {"field": "y", "type": "quantitative", "title": TITLES.get(y, y.replace("_", " "))},
        "color": {"field": "c", "type": "nominal", "title": color},
        "tooltip": [{"field": "name", "type": "nominal", "title": label},
                    {"field": "variant", "type": "nominal"},
                    {"field": "yl", "type": "nominal", "title": y.replace("_", " ")},
                    {"field": "xl", "type": "nominal", "title": x.replace("_", " ")}] + tips,
    }
    if shape:
        encoding["shape"] = {"field": "s", "type": "nominal", "title": shape.replace("_", " ")}
    layers = [{"mark": {"type": "point", "filled": True, "size": 70, "tooltip": True}, "encoding": encoding}]
    if y == "speedup":
        layers.append({"mark": {"type": "rule", "strokeDash": [4, 3], "color": "grey"},
                       "encoding": {"y": {"datum": 1}}})
    return {"$schema": SCHEMA, "title": title or f"{y} against {x}".replace("_", " "), "background": "white",
            "data": {"values": values}, "params": params, "transform": filters,
            "width": width, "height": height, "layer": layers}


def loader_script(element_id, spec):
    """The script that draws `spec` into the element: the site's Vega, else the same versions from a CDN (chapter 1)."""
    spec_json = json.dumps(spec, separators=(",", ":"), sort_keys=True).replace("</", "<\\/")
    v = VEGA_VERSIONS
    libs = [f"vega@{v['vega']}/build/vega.min", f"vega-lite@{v['vega-lite']}/build/vega-lite.min",
            f"vega-embed@{v['vega-embed']}/build/vega-embed.min"]
    return f"""(function () {{
  var el = document.getElementById({json.dumps(element_id)}), spec = {spec_json};
  var cdn = {json.dumps(CDN)}, libs = {json.dumps(libs)};
  function fail(error) {{ el.textContent = "The chart could not be drawn: " + error; console.error(error); }}
  function draw(embed) {{ embed(el, spec, {{actions: false, renderer: "svg"}}).catch(fail); }}
  if (window.vegaEmbed) {{ draw(window.vegaEmbed); return; }}
  // Outside the book's site (Jupyter, Colab): the same versions from a CDN.
  if (typeof window.requirejs === "function" && window.requirejs.config) {{
    window.requirejs.config({{paths: {{"vega": cdn + libs[0], "vega-lite": cdn + libs[1], "vega-embed": cdn + libs[2]}}}});
    window.requirejs(["vega-embed"], draw, fail);
    return;
  }}
  window.bookVegaLoading = window.bookVegaLoading || libs.reduce(function (ready, lib) {{
    return ready.then(function () {{
      return new Promise(function (resolve, reject) {{
        var script = document.createElement("script");
        script.src = cdn + lib + ".js";
        script.onload = resolve;
        script.onerror = function () {{ reject(new Error("could not load " + script.src)); }};
        document.head.appendChild(script);
      }});
    }});
  }}, Promise.resolve());
  window.bookVegaLoading.then(function () {{ draw(window.vegaEmbed); }}, fail);
}})();"""


def embed_html(spec, element_id=None):
    """The HTML of an explorer: an element for the chart and the script that draws it (chapter 1)."""
    if element_id is None:
        digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
        element_id = f"explorer-{digest}-{next(_ids)}"
    return (f'<div class="book-explorer" id="{html.escape(element_id)}"></div>\n'
            f"<script>\n{loader_script(element_id, spec)}\n</script>")


class Explorer:
    """A chart the reader filters in the browser: HTML in a notebook and on the site, a summary as text (chapter 1)."""

    def __init__(self, spec, summary=""):
        self.spec = spec
        self.summary = summary

    def _repr_html_(self):
        return embed_html(self.spec)

    def __repr__(self):
        menus = ", ".join(p["bind"]["name"].strip() for p in self.spec.get("params", []))
        head = f"explorer: {self.spec.get('title')} ({len(self.spec['data']['values'])} points; pick {menus})"
        return head + ("\n" + self.summary if self.summary else "")


def explorer(rows, pick="batch", category="variant", value="speedup", title=None, all_option=False):
    """Bars of `value` per variant with their spread and step time, a menu picks `pick` (chapter 1)."""
    spec = bar_spec(rows, pick=pick, category=category, value=value, title=title, all_option=all_option)
    summary = "\n".join(f"  {v['p0'] if 'p0' in v else ''} {v['cat']}: {v['label']}" for v in spec["data"]["values"])
    if not spec["data"]["values"]:
        summary = f"  no row measured {value}"
    return Explorer(spec, summary)


def scatter_explorer(rows, x="compile_s", y="speedup", pick="chapter", color="chapter", shape=None, label="workload",
                     title=None, log_x=True):
    """Points of `y` against `x`, a menu picks `pick` (all by default) (benchmarks page)."""
    spec = scatter_spec(rows, x=x, y=y, pick=pick, color=color, shape=shape, label=label, title=title, log_x=log_x)
    return Explorer(spec)
