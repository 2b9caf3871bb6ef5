"""The small library the book's notebooks share. Each function's docstring names the chapter that teaches it.

Importing it pulls in neither IPython nor ipywidgets: `glue`, `show_table` and the panels load them
when first used.
"""
from .compare import EAGER, break_even_calls, compare, compile_kwargs, describe, tolerance, variant_name
from .glue import count_text, glue, glue_num, ratio_text, rounds_verdict
from .env import (choose_preset, gpu_name, gpu_slug, max_autotune_skip_reason, pick_device, pick_dtype, pick_preset,
                  provenance, resolve_preset, without_max_autotune)
from .models import Block, BlockStack, block_stack, count_params
from .plots import cumulative_time, grouped_bars
from .results import load_results, results_path, save_results
from .runs import PartsPending, Run
from .timing import (Budget, OutOfTime, Timing, deadline, gpu_time_ms, sync, time_first_call, time_fn,
                     time_interleaved)

_LAZY = {"show_table": "tables", "compile_panel": "widgets", "explorer": "explore"}


def __getattr__(name):
    """Load the display helpers and chapter modules (utils.widgets, utils.llm, ...) on first use."""
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{name}":  # the module exists but needs something missing: say that
            raise
    raise AttributeError(f"module 'utils' has no attribute {name!r}")
