"""Where the code runs and what ran it: device, dtype, presets and provenance."""
import datetime
import os
import platform
import re
import subprocess
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


def pick_device():
    """'cuda' when a GPU is visible, else 'cpu' (chapter 1)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(device):
    """bf16 on GPUs of compute capability >= 8, fp16 on older GPUs (T4), fp32 on CPU (chapter 1)."""
    if device == "cpu":
        return torch.float32
    major, _ = torch.cuda.get_device_capability()
    return torch.bfloat16 if major >= 8 else torch.float16


def resolve_preset(preset, presets, device=None):
    """Turn 'auto' | 'smoke' | 'full' into (name, sizes): auto means full on CUDA, smoke on CPU (chapter 1)."""
    device = device or pick_device()
    name = ("full" if device == "cuda" else "smoke") if preset == "auto" else preset
    if name not in presets:
        choices = ", ".join(["auto", *presets])
        raise ValueError(f"Unknown preset {preset!r}: choose one of {choices}.")
    return name, presets[name]


def gpu_name():
    """The GPU's name as the driver reports it, or 'cpu' (chapter 1)."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def gpu_slug(name=None):
    """Folder name for results: 'NVIDIA H200' -> 'h200', 'Tesla T4' -> 't4', no GPU -> 'cpu' (chapter 1)."""
    name = name or gpu_name()
    name = re.sub(r"^((nvidia|tesla|geforce)\s+)+", "", name.strip(), flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "cpu"


def git_commit():
    """The checkout's commit ($BOOK_COMMIT where the tree travelled without .git), else 'unknown' (chapter 1)."""
    if os.environ.get("BOOK_COMMIT"):
        return os.environ["BOOK_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(preset=None):
    """What produced a measurement: GPU, capability, torch, triton, python, date, preset, commit (chapter 1)."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = torch.cuda.is_available()
    return {
        "gpu": gpu_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "preset": preset,
        "commit": git_commit(),
    }
