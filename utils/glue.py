"""myst-nb's glue, usable where myst-nb is not installed (the GPU box)."""
try:
    from myst_nb import glue
except ImportError:  # same output format as myst_nb.ext.glue.glue
    import IPython
    from IPython.display import display as _display

    def glue(name, variable, display=True):
        """Store a value's display in the notebook so the book's prose can show it (chapter 1)."""
        bundle, metadata = IPython.core.formatters.format_display_data(variable)
        prefix = "" if display else "application/papermill.record/"
        metadata["scrapbook"] = dict(name=name, mime_prefix=prefix)
        _display({prefix + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)
