"""Results files: results/<gpu>/<chapter>.json with provenance and measurements (DESIGN.md)."""
import json
import math
from pathlib import Path

from .env import REPO_ROOT, gpu_slug

REQUIRED_PROVENANCE = ("gpu", "torch", "python", "date", "preset")


def results_path(chapter, gpu=None, root=None):
    """Where a chapter's results live: results/<gpu-slug>/<chapter>.json (chapter 1)."""
    return Path(root or REPO_ROOT / "results") / gpu_slug(gpu) / f"{chapter}.json"


def _clean(value):
    """NaN and infinities are not JSON: store them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def save_results(chapter, measurements, provenance, root=None):
    """Write a chapter's measurements with their provenance; returns the path (chapter 1)."""
    missing = [k for k in REQUIRED_PROVENANCE if not provenance.get(k)]
    if missing:
        raise ValueError(f"provenance lacks {', '.join(missing)}")
    path = results_path(chapter, provenance["gpu"], root)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{k: _clean(v) for k, v in row.items()} for row in measurements]
    path.write_text(json.dumps({"provenance": provenance, "measurements": rows}, indent=1) + "\n")
    return path


def load_results(path):
    """Read a results file and check its shape; a clear error if it is not one (chapter 1)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No results file at {path}: run the chapter's notebook in the full preset first.")
    data = json.loads(path.read_text())
    if not isinstance(data.get("provenance"), dict) or not isinstance(data.get("measurements"), list):
        raise ValueError(f"{path} is not a results file: it needs 'provenance' and 'measurements'.")
    for row in data["measurements"]:
        if "workload" not in row or "variant" not in row:
            raise ValueError(f"{path}: every measurement needs 'workload' and 'variant'.")
    return data
