"""The benchmarks page: every results/<gpu>/<chapter>.json gathered into one page when the book is built.

book/_ext/benchmarks_page.py calls `write_page` as the build starts; the page (book/benchmarks.md,
git-ignored) shows each chapter's best recipe per workload, three explorers (speedup per chapter,
compile time against speedup, overhead-bound against compute-bound steps), the circulating claims
beside what the book measured, and others' published figures with their hardware
(book/_data/benchmarks.yml). A results file that is empty, not JSON or not a results file stops the
build with an error that names it; so does a chapter of the table of contents without one.
"""
import json
import re
from pathlib import Path

from . import explore
from .tables import cell_text

SKIPPED_FOLDERS = {"cpu"}  # smoke and CPU runs of the runner (git-ignored), not results of record
RUNS_FILE = "runs.json"  # results/<gpu>/runs.json: how long chapters ran as a small GPU (utils/workshop.py), no measurements
PAGE = Path("book") / "benchmarks.md"
SOURCES = Path("book") / "_data" / "benchmarks.yml"
FLOORS = (("floor_frac", "of floor"), ("roofline_frac", "of roofline"), ("mfu_spec", "MFU"))
OVERHEAD, COMPUTE, MIXED, UNKNOWN = "overhead-bound", "compute-bound", "in between", "GPU time not measured"


class ResultsError(Exception):
    """A results file (or a missing one) the page cannot be built from; the message names the file (benchmarks page)."""


def results_files(root):
    """Every results/<gpu>/*.json under `root`, GPU folders in order, CPU runs and runs files left out (benchmarks page)."""
    root = Path(root)
    return sorted(p for p in root.glob("*/*.json") if p.parent.name not in SKIPPED_FOLDERS and p.name != RUNS_FILE)


def read_json_file(path, kind, error=None):
    """A JSON file's data; `error` (ResultsError) naming the file if it cannot be read, is empty or is not JSON (benchmarks page)."""
    error = error or ResultsError
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as cause:
        raise error(f"{path}: cannot be read ({cause})") from cause
    if not text.strip():
        raise error(f"{path}: the {kind} file is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as cause:
        raise error(f"{path}: not valid JSON ({cause})") from cause


def read_results(path):
    """A results file's provenance and measurements; ResultsError naming the file if it is not one (benchmarks page)."""
    path = Path(path)
    data = read_json_file(path, "results")
    if not isinstance(data, dict) or not isinstance(data.get("provenance"), dict) \
            or not isinstance(data.get("measurements"), list):
        raise ResultsError(f"{path}: not a results file (it needs 'provenance' and 'measurements')")
    if not data["measurements"]:
        raise ResultsError(f"{path}: the results file has no measurements")
    for i, row in enumerate(data["measurements"]):
        if not isinstance(row, dict) or "workload" not in row or "variant" not in row:
            raise ResultsError(f"{path}: measurement {i} lacks 'workload' or 'variant'")
    return data


def chapter_label(stem):
    """'03b_quantized_decode' as 'chapter 3b' (benchmarks page)."""
    number = stem.split("_")[0].lstrip("0") or "0"
    return f"chapter {number}" if re.match(r"\d", number) else stem


def gather(root):
    """All rows of all results files, each with its chapter, GPU, torch and date (benchmarks page)."""
    files = results_files(root)
    if not files:
        raise ResultsError(f"{Path(root)}: no results file (results/<gpu>/<chapter>.json) to build the page from")
    rows = []
    for path in files:
        data = read_results(path)
        prov = data["provenance"]
        for row in data["measurements"]:
            rows.append({**row, "chapter": chapter_label(path.stem), "stem": path.stem, "file": path.as_posix(),
                         "gpu": prov.get("gpu") or path.parent.name, "torch": prov.get("torch"),
                         "date": prov.get("date")})
    return rows


def toc_chapters(repo):
    """The files of _toc.yml's 'Chapters' part, companions nested under a chapter included (benchmarks page)."""
    import yaml

    def files(entries):
        for entry in entries:
            yield entry["file"]
            yield from files(entry.get("sections", []))

    toc = yaml.safe_load((Path(repo) / "_toc.yml").read_text())
    return [f for part in toc.get("parts", []) if part.get("caption") == "Chapters"
            for f in files(part.get("chapters", []))]


def check_every_chapter_has_results(chapters, root):
    """ResultsError naming the expected file for each chapter of the toc that has no results file (benchmarks page)."""
    stems = {p.stem for p in results_files(root)}
    missing = [Path(c).name for c in chapters if Path(c).name not in stems]
    if missing:
        names = ", ".join(f"{Path(root).as_posix()}/<gpu>/{m}.json" for m in missing)
        raise ResultsError(f"no results file for {names}: run the chapter in the full preset (python -m utils.run_book)")


def measured(rows):
    """The rows that measured a speedup against eager (benchmarks page)."""
    return explore.measured(rows, "speedup")


def is_eager(row):
    """Whether a row is the eager baseline of its workload (benchmarks page)."""
    return str(row["variant"]).startswith("eager")


def with_regime(rows):
    """Rows with the eager step time of their workload (eager_ms) and its regime, where measured (benchmarks page)."""
    eager = {}
    for row in rows:
        key = (row["file"], row["workload"])
        if is_eager(row) and row.get("status", "ok") == "ok" and row.get("median_ms") and key not in eager:
            eager[key] = row
    out = []
    for row in rows:
        base = eager.get((row["file"], row["workload"]))
        eager_ms = row.get("eager_ms") or (base or {}).get("median_ms")
        regime = UNKNOWN
        if base and base.get("gpu_ms") and base.get("median_ms"):
            busy = base["gpu_ms"] / base["median_ms"]
            regime = OVERHEAD if busy < 0.5 else COMPUTE if busy >= 0.8 else MIXED
        out.append({**row, "eager_ms": eager_ms, "regime": regime})
    return out


def headline(rows):
    """The best compiled recipe of each chapter's workload on each GPU, in the files' order (benchmarks page)."""
    best = {}
    for row in measured(rows):
        if is_eager(row):
            continue
        key = (row["file"], row["workload"])
        if key not in best or row["speedup"] > best[key]["speedup"]:
            best[key] = row
    return list(best.values())


def floor_text(row):
    """How close the row came to its floor, named by kind; a dash where not measured (benchmarks page)."""
    for field, name in FLOORS:
        if isinstance(row.get(field), (int, float)):
            return f"{row[field]:.2f} {name}"
    return "-"


def _cell(text):
    """Text safe inside a Markdown table cell (benchmarks page)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text):
    """A name as inline code in a table cell (benchmarks page)."""
    return f"`{_cell(str(text).replace('`', ''))}`"


def chapter_link(row, chapters, short=True):
    """The chapter as a link to its page where the toc has it ('3b', or 'chapter 3b'), else its name (benchmarks page)."""
    doc = next((c for c in chapters if Path(c).name == row["stem"]), None)
    text = row["chapter"].replace("chapter ", "") if short else row["chapter"]
    return f"[{text}](../{doc}.ipynb)" if doc else text


def table(headers, lines):
    """A Markdown table in a container the book's CSS sets smaller (benchmarks page)."""
    out = ["```{container} benchmarks-table", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out + ["```"])


def headline_table(rows, chapters):
    """The best recipe per workload, as a Markdown table (benchmarks page)."""
    lines = [[chapter_link(r, chapters), _code(r["workload"]), _code(r["variant"]), cell_text(r, "speedup"),
              cell_text(r, "compile_s"), floor_text(r), cell_text(r, "peak_mem_gb"), _cell(r["gpu"]),
              _cell(r.get("torch") or "-"), _cell(r.get("date") or "-")] for r in headline(rows)]
    return table(["chapter", "workload", "best recipe", "speedup (rounds)", "compile s", "floor",
                  "memory GB", "GPU", "torch", "measured"], lines)


def without_speedup(rows):
    """The workloads with no compiled speedup measured, with their variants, compile range and floor (benchmarks page)."""
    has_headline = {(r["file"], r["workload"]) for r in headline(rows)}
    groups = {}
    for row in rows:
        key = (row["file"], row["workload"])
        if key not in has_headline and row.get("status", "ok") == "ok":
            groups.setdefault(key, []).append(row)
    return list(groups.values())


def without_speedup_table(rows, chapters):
    """The workloads measured without a speedup against eager, as a Markdown table (benchmarks page)."""
    lines = []
    for group in without_speedup(rows):
        first = group[0]
        compiles = sorted(r["compile_s"] for r in group if isinstance(r.get("compile_s"), (int, float)))
        span = "-" if not compiles else cell_text({"v": compiles[0]}, "v") if len(compiles) == 1 else \
            f"{cell_text({'v': compiles[0]}, 'v')}-{cell_text({'v': compiles[-1]}, 'v')}"
        floors = [r for r in group if floor_text(r) != "-"]
        best_floor = floor_text(max(floors, key=lambda r: next(r[f] for f, _ in FLOORS if isinstance(r.get(f), (int, float))))) \
            if floors else "-"
        variants = ", ".join(_code(v) for v in dict.fromkeys(r["variant"] for r in group))
        lines.append([chapter_link(first, chapters), _code(first["workload"]), variants, span, best_floor,
                      _cell(first["gpu"])])
    return table(["chapter", "workload", "variants", "compile s", "best floor", "GPU"], lines)


def claim_measurements(claim, rows):
    """What the book measured for a claim: the rows it names, as text with the chapter's link (benchmarks page)."""
    if not claim.get("chapter"):
        return []
    value = claim.get("value", "speedup")
    chosen = [r for r in explore.measured(rows, value) if r["stem"] == claim["chapter"]
              and re.search(claim["workload"], str(r["workload"]))
              and re.search(claim.get("variant", ""), str(r["variant"]))]
    show = claim.get("show", "best")
    if value == "speedup" and show != "each":
        compiled = [r for r in chosen if not is_eager(r)]
        if show == "best":
            chosen = [max(compiled, key=lambda r: r["speedup"])] if compiled else []
        else:
            chosen = headline(compiled)
    return chosen


def claims_table(claims, rows, chapters):
    """The circulating claims, their verdicts and what the book measured (benchmarks page)."""
    lines = []
    for claim in claims:
        found = claim_measurements(claim, rows)
        if found:
            value = claim.get("value", "speedup")
            measured_text = "; ".join(f"{_code(r['workload'])} {_code(r['variant'])}: {_cell(explore.bar_label(r, value))}"
                                      for r in found)
            measured_text += f" ({chapter_link(found[0], chapters, short=False)}, {_cell(found[0]['gpu'])})"
        elif claim.get("chapter"):
            measured_text = f"no measured row in `results/<gpu>/{claim['chapter']}.json`"
        else:
            measured_text = "not measured in this book"
        lines.append([_cell(claim["claim"]), f"**{_cell(claim['verdict'])}**", _cell(claim.get("truth", "")),
                      measured_text])
    return table(["claim", "verdict", "what is true (theirs)", "what the book measured"], lines)


def published_table(published):
    """Others' published figures, each with its hardware and source (benchmarks page)."""
    lines = [[f"[{_cell(p['who'])}]({p['url']})", _cell(p["what"]), _cell(p["figure"]), _cell(p["hardware"])]
             for p in published]
    return table(["source", "what", "their figure", "their hardware"], lines)


def raw_html(fragment):
    """A fenced raw-HTML block for MyST (benchmarks page)."""
    return f"```{{raw}} html\n{fragment}\n```"


def explorers(rows):
    """The page's three explorers as raw-HTML blocks, keyed by name (benchmarks page)."""
    gpus = list(dict.fromkeys(r["gpu"] for r in rows))
    picks = ("chapter", "gpu") if len(gpus) > 1 else ("chapter",)
    best = [{**r, "label": f"{r['chapter']} · {r['workload']} · {r['variant']}"} for r in headline(rows)]
    compiled = [r for r in with_regime(measured(rows)) if not is_eager(r)]
    speed = explore.bar_spec(best, pick=picks, category="label", value="speedup", all_option=True,
                             title="best recipe per workload: speedup over eager", width=300)
    compile_vs = explore.scatter_spec(compiled, x="compile_s", y="speedup", pick=picks, color="chapter",
                                      title="compile seconds (first call) against speedup")
    regimes = explore.scatter_spec(compiled, x="eager_ms", y="speedup", pick=picks, color="chapter",
                                   shape="regime", title="speedup against the eager step's time")
    return {name: raw_html(explore.embed_html(spec, f"benchmarks-{name}"))
            for name, spec in (("speedup", speed), ("compile", compile_vs), ("regimes", regimes))}


def page_markdown(repo):
    """The benchmarks page, as MyST Markdown, from the results files and book/_data/benchmarks.yml (benchmarks page)."""
    import yaml

    repo = Path(repo)
    chapters = toc_chapters(repo)
    check_every_chapter_has_results(chapters, repo / "results")
    rows = gather(repo / "results")
    sources = yaml.safe_load((repo / SOURCES).read_text())
    charts = explorers(rows)
    gpus = ", ".join(dict.fromkeys(r["gpu"] for r in rows))
    torches = ", ".join(sorted({str(r["torch"]) for r in rows if r.get("torch")}))
    dates = sorted({r["date"] for r in rows if r.get("date")})
    span = f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else (dates[0] if dates else "-")
    regimes = with_regime(measured(rows))
    overhead = [r for r in regimes if r["regime"] == OVERHEAD and not is_eager(r)]
    compute = [r for r in regimes if r["regime"] == COMPUTE and not is_eager(r)]

    def best_of(group):
        return max(group, key=lambda r: r["speedup"]) if group else None

    def described(row):
        return (f"{row['chapter']}, `{row['workload']}`, `{row['variant']}`: {explore.bar_label(row, 'speedup')}"
                if row else "none measured")

    return f"""# Benchmarks

Every number on this page comes from the results files the chapters write in their full runs
(`results/<gpu>/<chapter>.json`). The page is generated from those files each time the book is
built, so it shows what the chapters measured last: here on {gpus} with torch {torches}, runs dated
{span}. Each chapter explains its own measurements; follow the links for the workloads, the sizes
and what the numbers mean.

How to read the numbers. **speedup** is eager time over compiled time, measured in the same
process; where a chapter alternated eager and compiled rounds, the range of the rounds follows in
parentheses. **compile s** is the first call of the compiled model (compilation included).
**floor** says how close the recipe came to the hardware's limit where the chapter measured one:
the fraction of the memory-bandwidth roofline for decoding ("of roofline"), the model FLOP
utilisation against the GPU's specified peak for training ("MFU"). **memory GB** is the variant's peak memory. A dash means
the chapter did not measure that quantity for that row.

## The best recipe per workload

The compiled variant with the largest speedup for each workload of each chapter. Pick a chapter
in the menu below the chart (or all of them); hover over a bar for its step time, compile time and
memory.

{charts['speedup']}

{headline_table(rows, chapters)}

Some workloads measure something other than a speedup against eager: a compile time, a
recompile, an accuracy, a profile. Their chapters explain them:

{without_speedup_table(rows, chapters)}

## Compile time against speedup

Each point is one compiled variant. Compile time is paid once per process (less with a warm
cache, see [chapter 1](../notebooks/01_mechanism.ipynb)); the speedup is paid back on every call.
A recipe in the upper left is cheap and pays; one in the lower right costs minutes for little.

{charts['compile']}

## Overhead-bound and compute-bound steps

The same variants against the time of the eager step they replace. Where a chapter measured the
GPU's own time for the eager step, the point's shape says which regime the step was in: the GPU
busy for less than half of the step's wall time is **overhead-bound** (Python and kernel launches
dominate, and CUDA graphs or fusion remove that), busy for most of it is **compute-bound** (only
faster kernels help). Best measured overhead-bound: {described(best_of(overhead))}. Best measured
compute-bound: {described(best_of(compute))}.

{charts['regimes']}

## Claims that circulate, and what the book measured

Numbers that articles repeat about `torch.compile`, with the verdict of the
[myths and FAQ](myths.ipynb) page, what a source says instead, and the book's own measurement of the
closest workload. The book's figures are for its own models, sizes and GPU: they say what happened
here, not what the claim's author would have seen.

{claims_table(sources.get("claims", []), rows, chapters)}

## What others published

Figures others measured and published, quoted as theirs, on their hardware (not this book's GPU);
the [references](references.md) list every source.

{published_table(sources.get("published", []))}
"""


def write_page(repo):
    """Write book/benchmarks.md from the results files; returns its path (benchmarks page)."""
    path = Path(repo) / PAGE
    text = page_markdown(repo)
    if not path.exists() or path.read_text() != text:  # an unchanged page keeps its time stamp
        path.write_text(text)
    return path
