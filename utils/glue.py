"""myst-nb's glue, usable where myst-nb is not installed (the GPU box), hidden by default."""


def glue(name, value, display=False):
    """Store a value's display in the notebook for the prose to show with {glue:text} (chapter 1).

    Same output as myst_nb.glue. Strings are stored as their repr ('1.5x'); myst-nb strips the
    quotes again when it renders them.
    """
    from IPython.core.formatters import format_display_data
    from IPython.display import display as _display

    bundle, metadata = format_display_data(value)
    prefix = "" if display else "application/papermill.record/"  # myst_nb.ext.glue.GLUE_PREFIX
    metadata["scrapbook"] = dict(name=name, mime_prefix=prefix)
    _display({prefix + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)


def glue_num(value, digits=1, missing="n/a"):
    """A measured number as text for glue: fixed digits, thousands separated; `missing` for None (chapter 3)."""
    return missing if value is None else f"{value:,.{digits}f}"


def count_text(count, noun, plural=None):
    """A count with its noun in the right number: '1 graph', '3 graphs', '0 graphs' (chapter 2)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def ratio_text(row, field="speedup", missing="not measured"):
    """A row's ratio with the range of its rounds, as prose shows it: '2.10x (rounds 1.90-2.30x)' (chapter 3b)."""
    if not row or row.get(field) is None:
        return missing
    if row.get(f"{field}_lo") is None:
        return f"{row[field]:.2f}x"
    return f"{row[field]:.2f}x (rounds {row[f'{field}_lo']:.2f}-{row[f'{field}_hi']:.2f}x)"


def rounds_verdict(row, than="eager", field="speedup", missing="not measured here"):
    """Where all of a row's rounds lie against one, as prose says it: 'faster than eager in every round' (chapter 4)."""
    if not row or row.get(field) is None:
        return missing
    if row[f"{field}_lo"] > 1:
        return f"faster than {than} in every round"
    if row[f"{field}_hi"] < 1:
        return f"slower than {than} in every round"
    return f"neither consistently faster nor slower than {than} (its rounds fall on both sides of one)"
