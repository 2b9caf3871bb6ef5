"""Explorers on the site: Vega, Vega-Lite and vega-embed on the pages that hold one, and the {explorer} directive.

The explorers are HTML with an inline script that calls the global `vegaEmbed`. The site serves the
three libraries itself (the Makefile vendors them into book/_vendor/vega/, served as
_static/vega/). They are UMD builds: loaded after require.js (which myst-nb adds, at priority 500,
to pages with widgets) they would register as anonymous AMD modules and RequireJS would fail with
"Mismatched anonymous define()". So they are added before it, at priority 400, as plain scripts,
and define the globals `vega`, `vegaLite` and `vegaEmbed`. Pages without an explorer load nothing.

A chapter's markdown draws an explorer of its committed measurements (every results/<gpu>/<chapter>.json)
at build time, with no kernel and no re-run:

    ```{explorer} 04_gnn
    :pick: workload
    :workloads: cora_train cora_infer
    :title: speedup over eager, by workload
    ```

`pick` names the fields the reader's menus choose (comma-separated; `gpu` is one), `value` the
measured field drawn (speedup by default), `workloads` and `variants` keep only those rows (names
separated by spaces); where a variant was measured twice for the same menu choice, the later row
is drawn. A chapter without a
results file, or a filter that leaves nothing, stops the build with an error that names it.
"""
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive, directives

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbour, as Sphinx's local_extensions loads it
from benchmarks_page import load_benchmarks, load_utils_module  # noqa: E402

MARKER = 'class="book-explorer"'
SCRIPTS = ("vega/vega.min.js", "vega/vega-lite.min.js", "vega/vega-embed.min.js")
PRIORITY = 400  # before the widget manager's require.js (500)


def add_vega(app, pagename, templatename, context, doctree):
    if MARKER not in context.get("body", ""):
        return
    for script in SCRIPTS:
        app.add_js_file(script, priority=PRIORITY)


def chapter_rows(repo, chapter):
    """Every committed measurement of one chapter, each with the GPU it ran on (the benchmarks page's rows)."""
    return [row for row in load_benchmarks().gather(Path(repo) / "results") if row["stem"] == chapter]


class ExplorerDirective(Directive):
    """```{explorer} <chapter>```: bars of a chapter's committed measurements, filtered by menus in the browser."""

    required_arguments = 1
    option_spec = {"pick": directives.unchanged, "value": directives.unchanged, "category": directives.unchanged,
                   "workloads": directives.unchanged, "variants": directives.unchanged,
                   "title": directives.unchanged}

    def run(self):
        chapter = self.arguments[0]
        env = self.state.document.settings.env
        benchmarks = load_benchmarks()
        try:
            rows = chapter_rows(env.srcdir, chapter)
        except benchmarks.ResultsError as error:
            raise self.error(f"explorer: {error}")
        if not rows:
            raise self.error(f"explorer: no results/<gpu>/{chapter}.json to draw {chapter}'s measurements from")
        wanted = self.options.get("workloads", "").split()
        if wanted:
            rows = [r for r in rows if r.get("workload") in wanted]
            missing = sorted(set(wanted) - {r.get("workload") for r in rows})
            if missing:
                raise self.error(f"explorer: {chapter}'s results have no workload {', '.join(missing)}")
        variants = self.options.get("variants", "").split()
        if variants:
            rows = [r for r in rows if r.get("variant") in variants]
        explore = load_utils_module("explore")
        pick = tuple(p.strip() for p in self.options.get("pick", "workload").split(",") if p.strip())
        category = self.options.get("category", "variant")
        latest = {tuple(str(r.get(f)) for f in (*pick, category)): r for r in rows}  # one bar each: the last measured
        rows = list(latest.values())
        spec = explore.bar_spec(rows, pick=pick, category=category,
                                value=self.options.get("value", "speedup"), title=self.options.get("title"))
        if not spec["data"]["values"]:
            raise self.error(f"explorer: no row of {chapter} measured {self.options.get('value', 'speedup')}")
        return [nodes.raw("", explore.embed_html(spec), format="html")]


def setup(app):
    app.connect("html-page-context", add_vega)
    app.add_directive("explorer", ExplorerDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
