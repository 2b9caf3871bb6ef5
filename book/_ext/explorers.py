"""Load Vega, Vega-Lite and vega-embed on the pages that hold an explorer (utils/explore.py).

The explorers are HTML with an inline script that calls the global `vegaEmbed`. The site serves the
three libraries itself (the Makefile vendors them into book/_vendor/vega/, served as
_static/vega/). They are UMD builds: loaded after require.js (which myst-nb adds, at priority 500,
to pages with widgets) they would register as anonymous AMD modules and RequireJS would fail with
"Mismatched anonymous define()". So they are added before it, at priority 400, as plain scripts,
and define the globals `vega`, `vegaLite` and `vegaEmbed`. Pages without an explorer load nothing.
"""
MARKER = 'class="book-explorer"'
SCRIPTS = ("vega/vega.min.js", "vega/vega-lite.min.js", "vega/vega-embed.min.js")
PRIORITY = 400  # before the widget manager's require.js (500)


def add_vega(app, pagename, templatename, context, doctree):
    if MARKER not in context.get("body", ""):
        return
    for script in SCRIPTS:
        app.add_js_file(script, priority=PRIORITY)


def setup(app):
    app.connect("html-page-context", add_vega)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
