"""The small library the book's notebooks share. Each function's docstring names the chapter that teaches it."""
from .compare import EAGER, break_even_calls, compare, compile_kwargs, tolerance, variant_name
from .env import gpu_name, gpu_slug, pick_device, pick_dtype, provenance, resolve_preset
from .glue import glue
from .models import Block, BlockStack, block_stack, count_params
from .plots import cumulative_time, grouped_bars
from .results import load_results, results_path, save_results
from .timing import Budget, OutOfTime, Timing, deadline, sync, time_first_call, time_fn
from .widgets import compile_panel
