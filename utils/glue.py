"""myst-nb's glue, with plain strings shown without quotes, and usable where myst-nb is missing (the GPU box)."""
import IPython
from IPython.display import display as _display


class _Text(str):
    """A string whose display is the bare text, so {glue:text} shows no quotes."""

    def __repr__(self):
        return str(self)


def glue(name, value, display=False):
    """Store a value's display in the notebook for the prose to show with {glue:text} (chapter 1)."""
    value = _Text(value) if isinstance(value, str) else value
    bundle, metadata = IPython.core.formatters.format_display_data(value)
    prefix = "" if display else "application/papermill.record/"  # myst_nb.ext.glue.GLUE_PREFIX
    metadata["scrapbook"] = dict(name=name, mime_prefix=prefix)
    _display({prefix + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)
