"""Reports that a chapter's run made, published with the site: results/<gpu>/tlparse/<name>/ -> _static/<name>/.

Chapter 6 runs a small script under `TORCH_TRACE` and turns its trace into an HTML report with
`tlparse`, written to results/<gpu>/tlparse/tuning-tlparse/ and committed with the chapter's
results. Its page links to `../_static/tuning-tlparse/index.html`; this extension adds every
results/<gpu>/tlparse/ folder to `html_static_path` as the build starts, so Sphinx copies each report
into the site's _static/ (CPU runs, git-ignored, are left out). Two GPUs' folders holding a report of
the same name would overwrite each other there: that stops the build with an error naming both.
"""
import sys
from pathlib import Path

from sphinx.errors import ExtensionError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbour, as Sphinx's local_extensions loads it
from benchmarks_page import load_utils_module  # noqa: E402

REPORTS = "tlparse"  # results/<gpu>/tlparse/<report name>/index.html


def report_folders(results):
    """Each results/<gpu>/tlparse/ folder with at least one report in it, GPU folders in order."""
    skipped = load_utils_module("benchmarks").SKIPPED_FOLDERS  # smoke and CPU runs: not results of record
    return [folder for folder in sorted(Path(results).glob(f"*/{REPORTS}"))
            if folder.is_dir() and folder.parent.name not in skipped and any(folder.iterdir())]


def add_reports(app, config):
    """Put each report folder on html_static_path; a report name found under two GPUs is an error."""
    seen = {}
    for folder in report_folders(Path(app.srcdir) / "results"):
        for report in sorted(p for p in folder.iterdir() if p.is_dir()):
            if report.name in seen:
                raise ExtensionError(f"run reports: {seen[report.name]} and {report} would both be "
                                     f"_static/{report.name}/ on the site: keep one")
            seen[report.name] = report
        config.html_static_path = [*config.html_static_path, str(folder.resolve())]


def setup(app):
    app.connect("config-inited", add_reports)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
