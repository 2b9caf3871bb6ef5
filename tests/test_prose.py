"""No hand-typed numbers in the chapters' prose: every measured number comes from a glue role.

The book's numbers come from the run (myst-nb `{glue:text}` roles filled from the committed
outputs), never typed by hand, so that the prose cannot disagree with the measurements beside it.
`digits_in_prose` enforces that on every markdown cell of every notebook, chapters and drafts,
and on the book pages listed in PAGES (the workshop guide, whose times come from recorded runs):
it reports each digit (0-9) the reader would see in running prose. A digit is allowed only in:

1. a glue role, {glue}`name` or {glue:text}`name` (any {glue:...} form), and any other MyST role,
   {doc}`...`, {ref}`...`, {math}`...` (the role's content is a name or markup, not prose);
2. inline code, `...` or ``...``, and fenced blocks: ``` or ~~~ code fences with their content;
   the {exercise} and {solution} directive blocks with all their content (workshop material that
   works through arithmetic); for any other directive ({note}, {admonition}...) only its fence
   lines and option lines (":label: ...") are exempt, its content is prose and is checked;
3. math: $...$ and $$...$$;
4. link targets and URLs: the (target) of [text](target) and ![alt](target), <http...> and bare
   http(s)://... addresses;
5. the section number of a heading ("## 3. Title", "# 2b. Title"): the number right after the
   #s, nothing else on the heading line; and a numbered-list marker ("1. ", "2) ") at the start of
   a line, which is Markdown syntax;
6. a cross-reference to a numbered part of the book: "chapter 2", "chapters 2 and 3",
   "section 8", "sections 3 and 6" (a labelling number, not a measurement);
7. a version number right after the name of a software package or a product: "PyTorch 2.5",
   "torch 2.11", "Python 3.12", "CUDA 12.4", "transformers 5", "PyG 2.5", "SD 1.5", "PEP 523",
   "Flash Attention 3" (the names are listed in VERSIONED);
8. a citation of others' figures, defined narrowly: a whole sentence may keep its digits when it
   contains a Markdown link [text](target), or a citation marker: "(source", an issue or pull
   request reference such as "#1234" or "owner/repo#1234", or "et al." (a paper). Sentences end
   at ".", "!" or "?" followed by white space, at a blank line and at a list item's start;
9. a name that contains digits, one token (a run of letters, digits and "_", joined by "-" or
   "." inside it) that either starts with letters followed, after at most one "-" or "_", by a
   digit (ResNet-50, bf16, fp16, int8, float8, H200, A100, sm_90, GPT-2, Llama-3-8B, SD-1.5,
   Flux-1-Dev), or starts with an integer directly followed by letters that are not a unit or an
   ordinal suffix (2D, 3D, 7B, chapter names 2b and 3b). Units (see UNITS: x, ms, s, us, GB, k,
   M ...) make a number, not a name: "1.7x", "5x", "16GB", "224x224", "10k", "2nd" are
   numbers; so are scientific notation ("1e-4") and anything with a decimal point or comma before
   its letters ("1.5B").

Everything else with a digit fails: "the step took 3.0 ms", "a 10-minute run", "batch 8",
"about 0.06". Counts and small structural integers are written as words ("two graphs"); a
measured number is glued; a configuration value is quoted as code (`n_layers=24`).
"""
import json
import re
from pathlib import Path

import pytest

from conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))  # the chapters and the drafts of the next ones
IDS = [nb.stem for nb in NOTEBOOKS]
# book pages held to the same rule: their times come from recorded runs (book/_ext/workshop_runs.py)
PAGES = [REPO / "book" / "workshop.md"]

# Letters right after an integer that make it a measured quantity, not a name ("5x", "16GB", "2nd").
UNITS = {"x", "X", "ms", "s", "us", "µs", "ns", "min", "h", "hr", "hrs", "sec", "secs",
         "B/s", "GB", "MB", "KB", "kB", "TB", "PB", "GiB", "MiB", "KiB", "TiB", "Gb", "Mb",
         "k", "K", "M", "G", "T", "px", "fps", "W", "GHz", "MHz", "st", "nd", "rd", "th"}
VERSIONED = (r"PyTorch|torch|Python|CUDA|cuDNN|Triton|triton|transformers|diffusers|torchao|"
             r"torchvision|PyG|torch_geometric|accelerate|jupyter-book|Jupyter Book|myst-nb|numpy|NumPy|"
             r"PEP|SD|SDXL|Stable Diffusion|Flash Attention|FlashAttention")

FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})\s*(\{[\w:-]+\})?")
FENCE_OPTION = re.compile(r"^\s*:[\w-]+:")
EXEMPT_SPANS = [
    re.compile(r"\{[\w:.+-]+\}`[^`]*`"),                       # {glue:text}`name`, {doc}`x`, {ref}`y`
    re.compile(r"``(?:[^\n]|\n(?!\s*\n))+?``"),                 # ``inline code`` (may wrap a line)
    re.compile(r"`(?:[^`\n]|\n(?!\s*\n))+`"),                    # `inline code` (may wrap a line)
    re.compile(r"\$\$.+?\$\$", re.S),                          # $$ display math $$
    re.compile(r"(?<![\\\w])\$[^$\n]+\$"),                     # $inline math$
    re.compile(r"(?<=\])\([^)\s]*\)"),                         # the (target) of [text](target)
    re.compile(r"<https?://[^>]+>"),                           # <autolinks>
    re.compile(r"https?://[^\s)>\]]+"),                        # bare URLs
    re.compile(r"^(\s*#{1,6}\s+)\d+[a-z]?(?:\.\d+)*\.?(?=\s)", re.M),   # "## 3. Title"
    re.compile(r"^\s*\d+[.)](?=\s)", re.M),                    # "1. " list markers
    re.compile(r"\b(?:[Cc]hapters?|[Ss]ections?)\s+\d+[a-z]?(?:(?:\s*,\s*|\s+and\s+|\s+or\s+|\s*-\s*)\d+[a-z]?)*"),
    re.compile(rf"\b(?:{VERSIONED})\s+v?\d+(?:\.\d+)*(?:\.\w+)?\+?(?![\w.])"),
]
CITATION = re.compile(r"\]\(|\(source|(?<![\w&])(?:[\w.-]+/[\w.-]+)?#\d+|\bet al\.")
TOKEN = re.compile(r"[A-Za-z0-9_µ]+(?:[-.,/][A-Za-z0-9_µ]+)*")
NAME_LETTERS_FIRST = re.compile(r"[A-Za-z]+[-_]?\d")
NAME_DIGITS_FIRST = re.compile(r"(\d+)([A-Za-z]+)")
SCIENTIFIC = re.compile(r"\d+(?:\.\d+)?[eE][-+]?\d+")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)|\n\s*\n|\n(?=\s*(?:[-*+]|\d+[.)])\s)")


def blank(text, start, end):
    """text with [start, end) replaced by spaces (newlines kept, so offsets and lines stay put)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def whole_block(name):
    """Whether a fenced block is exempt with its content: a code fence, or an exercise or solution."""
    return name is None or name in ("{exercise}", "{solution}") or "code" in name or "math" in name


def strip_fences(source):
    """Blank code fences and exercise/solution blocks whole; other directives' fence and option lines."""
    out, stack = [], []  # stack: (opening fence, whether the whole block is exempt)
    for line in source.split("\n"):
        match = FENCE.match(line)
        if stack:
            fence, whole = stack[-1]
            if match and not match.group(2) and line.strip() == match.group(1) \
                    and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                stack.pop()  # the closing fence
                out.append(" " * len(line))
            elif whole:
                out.append(" " * len(line))
            elif match:  # a block opening inside a checked directive
                stack.append((match.group(1), whole_block(match.group(2))))
                out.append(" " * len(line))
            else:  # a checked directive's content: only its option lines are exempt
                out.append(" " * len(line) if FENCE_OPTION.match(line) else line)
        elif match:
            stack.append((match.group(1), whole_block(match.group(2))))
            out.append(" " * len(line))
        else:
            out.append(line)
    return "\n".join(out)


def is_name(token):
    """A model, hardware or dtype name with digits in it (ResNet-50, bf16, H200, 2D, 7B), not a number."""
    if SCIENTIFIC.match(token):
        return False
    if NAME_LETTERS_FIRST.match(token):
        return True
    match = NAME_DIGITS_FIRST.match(token)
    return bool(match) and match.group(2) not in UNITS


def digits_in_prose(source):
    """[(line number from 1, the line, [offending tokens])] for digits in a markdown cell's prose."""
    text = strip_fences(source)
    for pattern in EXEMPT_SPANS:
        for match in reversed(list(pattern.finditer(text))):
            text = blank(text, match.start(), match.end())
    found = {}
    start = 0
    bounds = [m.start() for m in SENTENCE_END.finditer(text)] + [len(text)]
    for end in bounds:
        sentence_original, sentence = source[start:end], text[start:end]
        if re.search(r"\d", sentence) and not CITATION.search(sentence_original):
            for token in TOKEN.finditer(sentence):
                if re.search(r"\d", token.group()) and not is_name(token.group()):
                    line = source.count("\n", 0, start + token.start()) + 1
                    found.setdefault(line, []).append(token.group())
        start = end
    lines = source.split("\n")
    return [(n, lines[n - 1], tokens) for n, tokens in sorted(found.items())]


def markdown_cells(path):
    """(cell index, source) of each markdown cell."""
    nb = json.loads(path.read_text())
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"]


# the checker itself -----------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "the step took 3.0 ms",
    "a 10-minute run",
    "compiled was 1.7x faster",
    "at batch 8 it was slower",
    "a relative difference of about 0.06",
    "It took 540 s.\n\nA new paragraph with a [link](https://example.com).",
    "The run used 5x less memory than 16GB.",
    "Images of 224x224 pixels.",
    "```{note}\nA note that says 3.0 ms.\n```",
    "{glue:text}`eager_ms` ms, but 2.5 ms by hand",
])
def test_checker_flags_hand_typed_numbers(text):
    assert digits_in_prose(text), f"not flagged: {text!r}"


@pytest.mark.parametrize("text", [
    "{glue:text}`eager_ms` ms",
    "the step took {glue:text}`eager_ms` ms, {glue}`speedup` faster",
    "`torch._dynamo.config.recompile_limit` defaults to `8`",
    "ResNet-50 in bf16 and fp16 on an H200 or an A100, Llama-3-8B, GPT-2, 2D and 3D, sm_90, float8, int8",
    "## 3. A GPT-style decoder",
    "# 2b. Tuning the training step",
    "see [chapter 2](02_training.ipynb), and section 8 and chapters 2 and 3",
    "block.compile() needs PyTorch 2.5 or later; Python 3.12 and torch 2.11 here",
    "the SD 1.5 UNet, Flash Attention 3, PEP 523",
    "about +0.7% at batch 256 in fp16 on an A100 (PaddlePaddle/benchmark#1672).",
    "transformers PR #34923 measured 27.08 s -> 6.54 s.",
    "the PyTorch 2 paper (Ansel et al., ASPLOS 2024) reports 1.41x.",
    "Flux compiled in 67.4 s (source: PyTorch devlog).",
    "NVIDIA lists 989 TFLOP/s ([data sheet](https://www.nvidia.com/en-us/data-center/h200/)).",
    "the ratio $989 / 2 / 4.8 \\approx 100$ multiply-adds per byte",
    "$$\\text{tokens/s} \\le 847$$",
    "```python\nx = torch.randn(3, 4)\n```",
    "```{exercise} Predict a ceiling\n:label: ex-1\nabout 790 TFLOP/s and 2.0 TB/s\n```",
    "```{solution} ex-1\n:class: dropdown\n6.7 B parameters x 2 bytes = 13.4 GB\n```",
    "1. **Eager.** The default.\n2. **Static.** The other one.",
    "see https://pytorch.org/docs/2.5/compile.html for more",
    "two graphs, one recompile, a chapter 3b profile",
])
def test_checker_passes_allowed_digits(text):
    assert not digits_in_prose(text), f"flagged: {digits_in_prose(text)}"


def test_checker_reports_the_line():
    text = "First line, fine.\nSecond line took 3.0 ms.\n{glue:text}`x` ms on the third."
    assert digits_in_prose(text) == [(2, "Second line took 3.0 ms.", ["3.0"])]


def test_citation_marker_covers_only_its_sentence():
    text = "Others saw 1.41x (Ansel et al., ASPLOS 2024). We saw 1.2x."
    assert [tokens for _, _, tokens in digits_in_prose(text)] == [["1.2x"]]


# the chapters -----------------------------------------------------------------------------------

def test_there_are_chapters():
    assert NOTEBOOKS, "no notebooks/[0-9]*.ipynb"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_prose_has_no_hand_typed_numbers(notebook):
    """Every digit in a chapter's prose is in a glue role, code, math, a link, a name or a citation."""
    found = [f"cell {i}, line {n}: {tokens} in {line.strip()!r}"
             for i, source in markdown_cells(notebook) for n, line, tokens in digits_in_prose(source)]
    assert not found, ("digits in the prose (glue measured numbers, write counts as words, quote "
                       "configuration as code; the rule is in this file's docstring):\n" + "\n".join(found))


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_book_page_prose_has_no_hand_typed_numbers(page):
    """The same rule for a book page: its whole Markdown is checked as one cell."""
    found = [f"line {n}: {tokens} in {line.strip()!r}" for n, line, tokens in digits_in_prose(page.read_text())]
    assert not found, ("digits in the prose (the rule is in this file's docstring):\n" + "\n".join(found))


PLURAL_S = re.compile(r"[a-z]\(e?s\)")  # 'graph(s)': a count the page could have put in words


def parenthesised_plurals(path):
    """(cell, line) of each 'noun(s)' in a notebook's prose or in the text its code prints."""
    nb = json.loads(path.read_text())
    found = []
    for i, cell in enumerate(nb["cells"]):
        for line in "".join(cell["source"]).split("\n"):
            in_text = cell["cell_type"] == "markdown" or re.search(r"[\"'][^\"']*[a-z]\(e?s\)", line)
            if in_text and PLURAL_S.search(line):
                found.append((i, line.strip()))
    return found


def test_the_plural_checker_sees_prose_and_printed_text_but_not_code():
    cells = [{"cell_type": "markdown", "source": ["made {glue:text}`n` graph(s)"]},
             {"cell_type": "code", "source": ['print(f"{n} graph(s) compiled")\n', "def duration(s):\n"]},
             {"cell_type": "markdown", "source": ["made {glue:text}`graphs_text`"]}]
    path = REPO / "_build" / "plural-check.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"cells": cells}))
    assert parenthesised_plurals(path) == [(0, "made {glue:text}`n` graph(s)"),
                                           (1, 'print(f"{n} graph(s) compiled")')]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_counts_are_written_with_their_noun_in_the_right_number(notebook):
    """'1 graph', '3 graphs' (utils.count_text), never '1 graph(s)' in prose or printed text."""
    found = parenthesised_plurals(notebook)
    assert not found, "write the count with utils.count_text:\n" + "\n".join(f"cell {i}: {line}" for i, line in found)


MACHINE_PATH = re.compile(r"PosixPath\(|/work/|/tmp/|/home/|/opt/|/root/|/content/")


def machine_paths(path):
    """(cell, text) of each place where a notebook's shown output names a path of the machine it ran on."""
    found = []
    for i, cell in enumerate(json.loads(Path(path).read_text())["cells"]):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                texts = [] if out.get("name") == "stderr" else ["".join(out["text"])]  # logs keep their own paths
            else:
                texts = ["".join(v) if isinstance(v, list) else str(v)
                         for kind, v in out.get("data", {}).items() if kind.startswith("text/")]
            found += [(i, text[m.start():m.start() + 80]) for text in texts for m in MACHINE_PATH.finditer(text)]
    return found


def test_the_machine_path_checker_sees_printed_paths_but_not_logs():
    cells = [{"cell_type": "code", "source": [], "outputs": [
                 {"output_type": "execute_result", "data": {"text/plain": ["PosixPath('results/x.json')"]}},
                 {"output_type": "stream", "name": "stdout", "text": ["saved to /work/main/results/x.json\n"]},
                 {"output_type": "stream", "name": "stderr", "text": ["File \"/tmp/ipykernel_1/2.py\", line 3\n"]},
                 {"output_type": "stream", "name": "stdout", "text": ["saved to results/x.json\n"]}]}]
    path = REPO / "_build" / "path-check.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"cells": cells}))
    assert [text[:10] for _, text in machine_paths(path)] == ["PosixPath(", "/work/main"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=IDS)
def test_outputs_show_no_machine_paths(notebook):
    """A page prints where its results went relative to the book, never a path of the machine it ran on."""
    found = machine_paths(notebook)
    assert not found, "\n".join(f"cell {i}: {text}" for i, text in found)
