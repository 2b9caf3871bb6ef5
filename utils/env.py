"""Where the code runs and what ran it: device, dtype, presets and provenance."""
import datetime
import os
import platform
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


def child_python_path(env=None):
    """PYTHONPATH for a child process that imports this book's utils, keeping the one it had (chapter 6)."""
    return os.pathsep.join(filter(None, [str(REPO_ROOT), (os.environ if env is None else env).get("PYTHONPATH")]))
SIMULATE_ENV = "BOOK_SIMULATE_GPU"  # e.g. "t4": a big GPU runs a chapter as if it were that small one
DTYPE_ENV = "BOOK_DTYPE"  # e.g. "bfloat16": a CPU runs a chapter in a GPU's dtype, to try its code paths
# What a small GPU offers that the chapters' choices depend on (memory a process can use, SMs, capability).
SMALL_GPUS = {"t4": {"name": "Tesla T4", "memory_gb": 15, "sms": 40, "capability": (7, 5)}}


def pick_device():
    """'cuda' when a GPU is visible, else 'cpu' (chapter 1)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def gpu_capability():
    """(major, minor) compute capability of the GPU this run acts as: the simulated small one, else the real (chapter 1)."""
    small = simulated_gpu()
    return tuple(small["capability"]) if small else torch.cuda.get_device_capability()


def pick_dtype(device):
    """bf16 on GPUs of compute capability >= 8, fp16 on older GPUs (T4), fp32 on CPU; $BOOK_DTYPE overrides (chapter 1)."""
    forced = os.environ.get(DTYPE_ENV, "").strip()
    if forced:
        dtype = getattr(torch, forced, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"{DTYPE_ENV}={forced!r} is not a floating-point torch dtype: use float32, bfloat16 or float16")
        return dtype
    if device == "cpu":
        return torch.float32
    major, _ = gpu_capability()
    return torch.bfloat16 if major >= 8 else torch.float16


def simulated_gpu():
    """The small GPU this run stands in for ($BOOK_SIMULATE_GPU, e.g. t4), or None (chapter 1)."""
    key = os.environ.get(SIMULATE_ENV, "").strip().lower()
    if not key:
        return None
    if key not in SMALL_GPUS:
        raise ValueError(f"{SIMULATE_ENV}={key!r}: choose one of {', '.join(SMALL_GPUS)}")
    return SMALL_GPUS[key]


def simulate_small_gpu(small):
    """Cap this process's GPU memory, compile on two threads: a big GPU acts as `small`; its fake properties (chapter 1)."""
    import torch._inductor.config as inductor_config

    real = torch.cuda.get_device_properties(0)
    limit = small["memory_gb"] * 1e9
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / real.total_memory))
    inductor_config.compile_threads = 2  # Colab's two vCPUs
    if not hasattr(torch.cuda.mem_get_info, "simulated"):  # what is free, as the small GPU would report it
        real_mem_get_info = torch.cuda.mem_get_info

        def mem_get_info(device=None):
            free, _ = real_mem_get_info(device)
            return min(free, max(0, int(limit) - torch.cuda.memory_reserved(device))), int(limit)

        mem_get_info.simulated = True
        torch.cuda.mem_get_info = mem_get_info
    return SimpleNamespace(name=f"{small['name']} (simulated on {real.name})", total_memory=limit,
                           multi_processor_count=small["sms"], major=small["capability"][0],
                           minor=small["capability"][1])


MAX_AUTOTUNE_MIN_SMS = 68  # torch._inductor.utils.is_big_gpu: below this, max-autotune skips its matmul search


def max_autotune_skip_reason(device):
    """Why this GPU runs no max-autotune (too few SMs for Inductor's matmul search), or None where it can (chapter 1)."""
    if device != "cuda":
        return None
    small = simulated_gpu()
    if small:
        name, sms = small["name"], small["sms"]
    else:
        props = torch.cuda.get_device_properties(0)
        name, sms = props.name, props.multi_processor_count
    if sms >= MAX_AUTOTUNE_MIN_SMS:
        return None
    return (f"{name} has {sms} SMs: Inductor searches matmul templates only on GPUs with at least "
            f"{MAX_AUTOTUNE_MIN_SMS} (torch._inductor.utils.is_big_gpu), so this run leaves max-autotune out")


def without_max_autotune(variants, device):
    """The variants (modes or compile options) less max-autotune's on a GPU too small for it, saying why (chapter 1)."""
    why = max_autotune_skip_reason(device)
    if why is None:
        return list(variants)
    print(why)
    return [v for v in variants if not re.search(r"max[-_]autotune", repr(v))]


FULL_GPU_GB = 75  # an 80 GB card reports a little less
COLAB_GPU_GB = (14, 40)  # T4 (15 GB), L4 and A10 (22-24 GB)


def choose_preset(props=None):
    """(preset, why) for this machine: full, colab, workshop or smoke, by the GPU found (chapter 1).

    `props` stands for torch.cuda.get_device_properties(0) (tests pass a fake); None means look.
    """
    if props is None:
        if not torch.cuda.is_available():
            return "smoke", "no CUDA GPU: the smoke sizes check that every cell works on a CPU"
        small = simulated_gpu()
        props = simulate_small_gpu(small) if small else torch.cuda.get_device_properties(0)
    gb = props.total_memory / 1e9
    if gb >= FULL_GPU_GB:
        return "full", f"{props.name} has {gb:.0f} GB: the published sizes fit"
    if COLAB_GPU_GB[0] <= gb < COLAB_GPU_GB[1]:
        return "colab", f"{props.name} has {gb:.0f} GB: sizes for a 15-24 GB GPU"
    return "workshop", f"{props.name} has {gb:.0f} GB: the workshop sizes, a chapter in minutes"


def pick_preset(preset, presets, props=None):
    """(name, sizes, why) for PRESET: 'auto' chooses by the hardware; a chapter without that preset uses a smaller one (chapter 1)."""
    if preset == "auto":
        name, why = choose_preset(props)
    elif preset in presets:
        name, why = preset, "chosen by hand"
    else:
        choices = ", ".join(["auto", *presets])
        raise ValueError(f"Unknown preset {preset!r}: choose one of {choices}.")
    for fallback in (name, "workshop", "smoke"):
        if fallback in presets:
            if fallback != name:
                why += f"; this chapter has no {name!r} preset, so it runs {fallback!r}"
            return fallback, presets[fallback], why
    raise ValueError(f"the chapter defines no preset to run: {', '.join(presets)}")


def resolve_preset(preset, presets, device=None):
    """(name, sizes) for PRESET: 'auto' picks by the hardware found (see pick_preset) (chapter 1)."""
    if device == "cpu":
        return pick_preset(preset if preset != "auto" else "smoke", presets)[:2]
    return pick_preset(preset, presets)[:2]


def gpu_name():
    """The GPU's name as the driver reports it (or the small GPU it stands in for), or 'cpu' (chapter 1)."""
    if not torch.cuda.is_available():
        return "cpu"
    small = simulated_gpu()
    return f"{small['name']} (simulated on {torch.cuda.get_device_name()})" if small else torch.cuda.get_device_name()


def gpu_slug(name=None):
    """Folder name for results: 'NVIDIA H200' -> 'h200', a T4 simulated on it -> 't4-simulated-on-h200', no GPU -> 'cpu' (chapter 1)."""
    name = name or gpu_name()
    name = re.sub(r"\b(nvidia|tesla|geforce)\s+", "", name.strip(), flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "cpu"


def is_simulated(slug):
    """Whether a results folder ('t4-simulated-on-h200', from gpu_slug) holds runs as a simulated small GPU (chapter 1)."""
    return "-simulated-on-" in slug


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
        "capability": ".".join(map(str, (simulated_gpu() or {}).get("capability") or
                                    torch.cuda.get_device_capability())) if cuda else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        **({"preset": preset} if preset else {}),  # the setup cell prints this before a preset is chosen
        "commit": git_commit(),
    }
