"""Write each inline <script> once per page (a Sphinx extension for this book's build).

Sphinx 7.4 (the series jupyter-book 1.x requires) writes an inline script that an extension adds
after the HTML builder has started twice: once as added, and again when it prepares the pages.
sphinx-thebe, which jupyter-book always loads, adds `const THEBE_JS_URL = ...` that way, and the
second copy raises "SyntaxError: Identifier 'THEBE_JS_URL' has already been declared" in every
page's console. This keeps the first copy of each inline script and drops the repeats.
"""


def keep_first_inline_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        filename = getattr(script, "filename", script)
        body = getattr(script, "attributes", {}).get("body")
        if not filename and body:
            if body in seen:
                continue
            seen.add(body)
        kept.append(script)
    scripts[:] = kept


def setup(app):
    # after the handlers that add per-page scripts (myst-nb's widget scripts among them)
    app.connect("html-page-context", keep_first_inline_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
