"""Execute chapters in place with papermill on this machine, refreshing their outputs and results/.

    python -m utils.run_book                       # every chapter, preset auto (full on a GPU)
    python -m utils.run_book --preset smoke notebooks/01_mechanism.ipynb
    python -m utils.run_book --out /tmp/executed   # write executed copies elsewhere instead
"""
import argparse
import sys
from pathlib import Path

from .env import REPO_ROOT

NOTEBOOKS = REPO_ROOT / "notebooks"


def execute(notebook, preset="auto", out_dir=None, timeout=None):
    """Run one notebook top to bottom with PRESET set; returns the executed notebook's path (chapter 1)."""
    import papermill

    notebook = Path(notebook).resolve()
    if not notebook.exists():
        raise FileNotFoundError(f"No notebook at {notebook}")
    target = Path(out_dir).resolve() / notebook.name if out_dir else notebook
    target.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(str(notebook), str(target), parameters={"PRESET": preset},
                               cwd=str(notebook.parent), kernel_name="python3",
                               progress_bar=False, execution_timeout=timeout)
    return target


def main(argv=None):
    """Command line: which notebooks, which preset, where to write (chapter 1)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="default: every notebooks/*.ipynb")
    parser.add_argument("--preset", default="auto", help="auto | smoke | full (default auto)")
    parser.add_argument("--out", help="folder for executed copies (default: in place)")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    failed = []
    for nb in notebooks:
        print(f"== {nb} (preset {args.preset})", flush=True)
        try:
            execute(nb, args.preset, args.out)
        except Exception as error:  # report and go on to the next chapter
            print(f"   FAILED: {type(error).__name__}: {str(error)[:2000]}", flush=True)
            failed.append(str(nb))
    if failed:
        print("failed:", *failed, sep="\n  ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
