"""What every chapter needs around torch.compile: caches, freeing compiled code, out-of-memory errors, CUDA-graph steps."""
import contextlib
import os
from pathlib import Path

import torch


def is_oom(error):
    """Whether an exception is an out-of-memory error, on GPU or CPU (chapter 3)."""
    return isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)) or "out of memory" in str(error).lower()


@contextlib.contextmanager
def compile_cache(folder):
    """Inductor and Triton caches in `folder`, in-memory ones cleared: empty = cold, filled = warm (chapter 3)."""
    import torch._inductor.utils as inductor_utils

    clear = (getattr(inductor_utils, "clear_caches", None) or getattr(inductor_utils, "clear_inductor_caches", None)
             or (lambda: None))  # named clear_inductor_caches before torch 2.8
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    clear()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    try:
        yield folder
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def free_compiled():
    """Forget compiled code and CUDA graphs and return cached GPU memory, between configurations (chapter 3)."""
    import gc

    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cudagraph_step_begin():
    """Tell CUDA graphs (reduce-overhead) a new step starts; a no-op without a GPU or while traced (chapter 1)."""
    if torch.cuda.is_available() and not torch.compiler.is_compiling():
        torch.compiler.cudagraph_mark_step_begin()
