"""The explorers (utils/explore.py): Vega-Lite charts of result rows filtered by a menu in the browser.

Fast tests of the specs and their HTML; the Vega-Lite schema check needs the vendored schema
(`make setup` puts it in .cache/); tests/test_benchmarks.py opens a page with explorers in Chromium.
"""
import json
import os
import re
from types import SimpleNamespace

import pytest

from conftest import REPO
from utils import explore

SCHEMA = REPO / ".cache" / "vega-lite-schema.json"
ROWS = [
    {"workload": "batch 1", "variant": "eager", "batch": 1, "median_ms": 2.7, "speedup": 1.0,
     "speedup_lo": 1.0, "speedup_hi": 1.0, "compile_s": 0.0, "status": "ok"},
    {"workload": "batch 1", "variant": "default", "batch": 1, "median_ms": 2.2, "speedup": 1.35,
     "speedup_lo": 1.21, "speedup_hi": 1.76, "compile_s": 1.1, "peak_mem_gb": 0.34, "status": "ok"},
    {"workload": "batch 1", "variant": "reduce-overhead", "batch": 1, "status": "skipped: CUDA graphs need a GPU"},
    {"workload": "batch 64", "variant": "eager", "batch": 64, "median_ms": 10.9, "speedup": 1.0, "status": "ok"},
    {"workload": "batch 64", "variant": "default", "batch": 64, "median_ms": 10.2, "speedup": 1.07,
     "compile_s": 7.0, "status": "ok"},  # no rounds: no spread
]


def values_for(spec, *picked):
    """The data rows the chart shows when its menus hold `picked` (its filters, evaluated here)."""
    return [item for item in spec["data"]["values"]
            if all((value == explore.ALL and "'all'" in step["filter"]) or item[f"p{i}"] == value
                   for i, (value, step) in enumerate(zip(picked, spec["transform"])))]


def test_bar_spec_binds_a_menu_per_picked_field_and_filters_by_it():
    spec = explore.bar_spec(ROWS, pick="batch")
    (param,) = spec["params"]
    assert param["bind"]["input"] == "select" and param["bind"]["options"] == ["1", "64"]
    assert param["value"] == "1", "the menu starts on the first value"
    assert spec["transform"] == [{"filter": "datum.p0 == pick0"}]
    assert [v["cat"] for v in values_for(spec, "1")] == ["eager", "default"]
    assert [v["cat"] for v in values_for(spec, "64")] == ["eager", "default"]


def test_bar_spec_keeps_measured_rows_with_their_spread_and_numbers():
    values = explore.bar_spec(ROWS, pick="batch")["data"]["values"]
    assert len(values) == 4, "the skipped row has no bar"
    default_1 = next(v for v in values if v["cat"] == "default" and v["p0"] == "1")
    assert (default_1["lo"], default_1["hi"], default_1["end"]) == (1.21, 1.76, 1.76)
    assert default_1["label"] == "1.35x (1.21-1.76) · 2.20 ms"
    default_64 = next(v for v in values if v["cat"] == "default" and v["p0"] == "64")
    assert default_64["lo"] == default_64["hi"] == 1.07 and default_64["label"] == "1.07x · 10.2 ms", \
        "no rounds: a rule of no length, and no spread in the label"
    assert [v["base"] for v in values] == [True, False, True, False], "eager bars are the baseline"


def test_all_option_and_several_menus():
    rows = [dict(r, gpu=g) for r in ROWS for g in ("NVIDIA H200", "NVIDIA A100")]
    spec = explore.bar_spec(rows, pick=("batch", "gpu"), all_option=True)
    assert [p["bind"]["options"] for p in spec["params"]] == [["all", "1", "64"], ["all", "NVIDIA H200", "NVIDIA A100"]]
    assert len(values_for(spec, "all", "all")) == 8
    assert [v["cat"] for v in values_for(spec, "64", "NVIDIA A100")] == ["eager", "default"]
    assert len(values_for(spec, "all", "NVIDIA H200")) == 4


def test_scatter_spec_drops_rows_a_log_axis_cannot_show():
    spec = explore.scatter_spec([dict(r, chapter="chapter 1") for r in ROWS], x="compile_s", y="speedup")
    assert sorted(v["x"] for v in spec["data"]["values"]) == [1.1, 7.0], "compile_s 0 (eager) cannot sit on a log axis"
    assert spec["params"][0]["bind"]["options"] == ["chapter 1"], "one chapter: no 'all' entry"


def test_explorer_html_draws_the_spec_with_the_page_vega_or_the_same_versions():
    shown = explore.explorer(ROWS, pick="batch", title="speedup </script> test")
    html = shown._repr_html_()
    element = re.search(r'<div class="book-explorer" id="([^"]+)"></div>', html)
    assert element, html[:200]
    assert f"document.getElementById({json.dumps(element.group(1))})" in html
    assert html.count("</script>") == 1, "the spec must not end the script early"
    spec_json = re.search(r"spec = (\{.*?\});\n", html).group(1).replace("<\\/", "</")
    assert json.loads(spec_json) == json.loads(json.dumps(shown.spec))
    assert "window.vegaEmbed" in html
    for name, version in explore.VEGA_VERSIONS.items():
        assert f"{name}@{version}/build/{name}.min" in html
    assert "pick batch" in repr(shown) and "default: 1.35x (1.21-1.76)" in repr(shown)
    assert html != explore.explorer(ROWS, pick="batch")._repr_html_(), "each explorer gets its own element"


def test_explorer_of_rows_without_the_value_says_so():
    shown = explore.explorer([{"workload": "w", "variant": "v", "status": "failed: out of memory"}])
    assert shown.spec["data"]["values"] == [] and "no row measured speedup" in repr(shown)


def test_vega_versions_agree_with_the_makefile():
    makefile = (REPO / "Makefile").read_text()
    for name, version in explore.VEGA_VERSIONS.items():
        assert re.search(rf"^{name.upper().replace('-', '_')} := {name}@{re.escape(version)}$", makefile, re.M), \
            f"the Makefile does not vendor {name}@{version}"


@pytest.mark.parametrize("build", [
    lambda: explore.bar_spec(ROWS, pick="batch"),
    lambda: explore.bar_spec(ROWS, pick=("batch", "workload"), all_option=True, value="median_ms"),
    lambda: explore.scatter_spec([dict(r, chapter="chapter 1", regime="overhead-bound") for r in ROWS],
                                 x="median_ms", y="speedup", shape="regime"),
], ids=["bars", "bars-two-menus", "scatter"])
def test_specs_are_valid_vega_lite(build):
    if not SCHEMA.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{SCHEMA} is missing: `make setup` vendors it")
        pytest.skip(f"{SCHEMA} is missing: `make setup` vendors it")
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(build()))
    assert not errors, [e.message[:300] for e in errors[:3]]


def test_the_site_loads_vega_before_require_only_on_pages_with_an_explorer():
    import importlib.util

    spec = importlib.util.spec_from_file_location("explorers_ext", REPO / "book" / "_ext" / "explorers.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    added = []
    app = SimpleNamespace(add_js_file=lambda name, **kw: added.append((name, kw.get("priority"))))
    ext.add_vega(app, "book/intro", "page.html", {"body": "<p>no chart</p>"}, None)
    assert added == []
    ext.add_vega(app, "book/benchmarks", "page.html", {"body": explore.embed_html({"mark": "bar"}, "x")}, None)
    assert [name for name, _ in added] == ["vega/vega.min.js", "vega/vega-lite.min.js", "vega/vega-embed.min.js"]
    assert all(priority < 500 for _, priority in added), "after require.js (500) the UMD builds register as AMD modules"
    for name, _ in added:
        assert (REPO / "book" / "_vendor" / name).exists() or not (REPO / "book" / "_vendor" / "vega").exists(), name


def test_chapter_one_explores_its_mode_sweep_after_the_plot():
    nb = json.loads((REPO / "notebooks" / "01_mechanism.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"]]
    plot = next(i for i, s in enumerate(cells) if 'grouped_bars(mode_rows, "speedup"' in s)
    assert re.search(r"```\{explorer\} 01_mechanism\n:pick: batch\n", cells[plot + 1]), cells[plot + 1]


def build_page(tmp_path, markdown, results=None):
    """Build one MyST page with the {explorer} directive in a scratch Sphinx project: (exit status, HTML, log)."""
    import contextlib
    import io

    from sphinx.cmd.build import build_main

    (tmp_path / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'book' / '_ext')!r})\n"
        "extensions = ['myst_parser', 'explorers']\nmyst_enable_extensions = ['colon_fence']\n")
    (tmp_path / "index.md").write_text("# Page\n\n" + markdown)
    for name, data in (results or {}).items():
        path = tmp_path / "results" / "nvidia-h200" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        status = build_main(["-q", "-W", "-b", "html", str(tmp_path), str(tmp_path / "_build")])
    page = tmp_path / "_build" / "index.html"
    return status, page.read_text() if page.exists() else "", log.getvalue()


RESULTS = {"provenance": {"gpu": "NVIDIA H200", "torch": "2.11"}, "measurements": ROWS}


def test_the_explorer_directive_draws_a_chapters_committed_results(tmp_path):
    status, html_text, log = build_page(
        tmp_path, "```{explorer} 09_demo\n:pick: batch\n:title: modes\n```\n", {"09_demo": RESULTS})
    assert status == 0, log
    assert 'class="book-explorer"' in html_text and "vegaEmbed" in html_text
    assert '"title":"modes"' in html_text


@pytest.mark.parametrize("markdown, says", [
    ("```{explorer} 09_missing\n```\n", "no results/<gpu>/09_missing.json"),
    ("```{explorer} 09_demo\n:workloads: nothing_here\n```\n", "no workload nothing_here"),
])
def test_the_explorer_directive_fails_the_build_naming_what_is_missing(tmp_path, markdown, says):
    status, _, log = build_page(tmp_path, markdown, {"09_demo": RESULTS})
    assert status != 0 and says in log, log
