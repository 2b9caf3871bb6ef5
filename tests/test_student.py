"""The student edition (`make student`): every exercise is there, no solution is.

`make student` builds the site with sphinx-exercise's `hide_solutions = True` into
_build/student/html. The test builds it once per session (a few seconds to minutes: the notebooks
are not executed), then compares each page of the toc with the exercises and solutions written in
its source, as their authors wrote them: an exercise must appear as an exercise admonition with
its label and title, and no run of words from a solution may appear anywhere in the page, in
prose or in a code block (a solution whose fence closes early leaks as a raw code block).
"""
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ANSI, REPO
from utils import benchmarks

STUDENT_HTML = REPO / "_build" / "student" / "html"
NGRAM = 8  # words in a row: long enough not to occur by chance, short enough for every solution
DIRECTIVE = re.compile(r"^\s*(`{3,}|:{3,})\{(exercise|solution)\}\s*(.*)$")
ROLE = re.compile(r"\{[\w:.-]+\}`[^`]*`")  # {glue:text}`name`, {ref}`label`: replaced by other text
MATH = re.compile(r"\$[^$]+\$")
LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
TAG = re.compile(r"<[^>]+>")
WORD = re.compile(r"[A-Za-z0-9_]+")


def toc_files():
    """Every document of the toc (root, parts, chapters, sections), as its source path."""
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    names = []

    def walk(node):
        if isinstance(node, dict):
            for key in ("root", "file"):
                if isinstance(node.get(key), str):
                    names.append(node[key])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    paths = []
    generated = {benchmarks.PAGE.with_suffix("").as_posix()}  # written by the build itself (book/_ext)
    for name in dict.fromkeys(names):
        if name in generated:
            continue
        found = [REPO / f"{name}{ext}" for ext in (".ipynb", ".md") if (REPO / f"{name}{ext}").exists()]
        assert found, f"_toc.yml lists {name}, which has no .ipynb or .md"
        paths.append(found[0])
    return paths


def markdown_of(path):
    """The Markdown text of a page: a .md file, or a notebook's markdown cells."""
    if path.suffix == ".md":
        return path.read_text()
    nb = json.loads(path.read_text())
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def directives(markdown):
    """[(kind, argument, options, body_text)] for each exercise and solution, as written.

    A body runs from the directive's line to the next directive or heading: the extent the author
    meant, whether or not the fences nest correctly (a fence that closes early is what this test is
    there to catch). Fence lines and `:option:` lines are left out of the body.
    """
    found, current = [], None
    for line in markdown.splitlines():
        match = DIRECTIVE.match(line)
        if match or line.startswith("#"):
            if current:
                found.append(current)
            current = None
        if match:
            current = (match.group(2), match.group(3).strip(), {}, [])
            continue
        if current is None:
            continue
        option = re.match(r"^\s*:(\w[\w-]*):\s*(.*)$", line)
        if option and not current[3]:
            current[2][option.group(1)] = option.group(2).strip()
        elif not re.match(r"^\s*(`{3,}|:{3,})\s*\w*\s*$", line):
            current[3].append(line)
    if current:
        found.append(current)
    return [(kind, arg, opts, "\n".join(body)) for kind, arg, opts, body in found]


def words(text):
    """The words of a source text or of a page's text, for comparing the two."""
    text = LINK.sub(r"\1", MATH.sub(" ", ROLE.sub(" ", text)))
    return WORD.findall(text.replace("\u2019", "'").replace("\u2018", "'"))


def page_words(page):
    """The words a built page shows (tags dropped, entities decoded), scripts and styles left out."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", page.read_text(), flags=re.S | re.I)
    return WORD.findall(html.unescape(TAG.sub(" ", text)).replace("\u2019", "'"))


def ngrams(seq, n=NGRAM):
    """Runs of n words (one run of the whole sequence when it is shorter)."""
    seq = [w.lower() for w in seq]
    if len(seq) <= n:
        return {tuple(seq)} if seq else set()
    return {tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)}


@pytest.fixture(scope="session")
def student_build():
    """`make student`, once per session: (exit status, log lines with a warning or error, the site folder).

    The setup step is skipped (`-o setup`): the venv is the one running this, and the JavaScript
    must be vendored already. The build's own outcome is one test; the pages are checked whenever
    it wrote them, so one broken chapter does not hide what the others show.
    """
    vendored = [REPO / "book" / "_vendor" / f for f in ("widgets/embed-amd.js", "mathjax/tex-mml-chtml.js")]
    if not all(path.exists() for path in vendored):
        pytest.fail("the site's JavaScript is not vendored into book/_vendor/: run `make student` "
                    "(or `make book`), which fetches it")
    cmd = ["make", "--no-print-directory", "-o", "setup", "student", f"PY={sys.executable}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    log = ANSI.sub("", proc.stdout + proc.stderr)
    (REPO / "_build").mkdir(exist_ok=True)
    (REPO / "_build" / "student-build.log").write_text(log)
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    return proc.returncode, warnings, STUDENT_HTML


@pytest.fixture(scope="session")
def student_site(student_build):
    """The student edition's folder, once `make student` has written its pages (warnings or not)."""
    status, warnings, html_dir = student_build
    if not (html_dir / "index.html").exists():
        pytest.fail(f"`make student` exited {status} and wrote no {html_dir.relative_to(REPO)}/index.html:\n"
                    + "\n".join(warnings[:40]))
    return html_dir


@pytest.mark.slow
def test_student_build_passes_with_warnings_as_errors(student_build):
    """The same bar as `make book`: -W -n --keep-going, so a broken page fails the student edition too."""
    status, warnings, _ = student_build
    assert status == 0 and not warnings, \
        f"`make student` exited {status} with {len(warnings)} warnings (all in _build/student-build.log):\n" + \
        "\n".join(warnings[:40])


SOURCES = [path for path in toc_files() if directives(markdown_of(path))]


def test_the_book_has_exercises_and_solutions():
    """The checks below are not empty: the chapters hold exercises, and solutions to hide."""
    found = [d for path in toc_files() for d in directives(markdown_of(path))]
    assert sum(kind == "exercise" for kind, *_ in found) >= 3, "the toc's pages hold fewer than 3 exercises"
    assert sum(kind == "solution" for kind, *_ in found) >= 3, "the toc's pages hold fewer than 3 solutions"


def test_directive_parser_reads_a_nested_fence():
    """A solution with a code block inside: the body keeps the code and drops the fences."""
    text = ("```{exercise} Count\n:label: ex-a\nCount the graphs.\n```\n\n````{solution} ex-a\n"
            ":class: dropdown\nTwo graphs.\n```python\nprint(1)\n```\n````\n## Takeaways\nnot a solution\n")
    (ex_kind, ex_title, ex_opts, ex_body), (sol_kind, sol_arg, sol_opts, sol_body) = directives(text)
    assert (ex_kind, ex_title, ex_opts, ex_body.strip()) == ("exercise", "Count", {"label": "ex-a"}, "Count the graphs.")
    assert (sol_kind, sol_arg, sol_opts) == ("solution", "ex-a", {"class": "dropdown"})
    assert sol_body.split() == ["Two", "graphs.", "print(1)"]


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_student_page_has_every_exercise_and_no_solution(student_site, source):
    page = student_site / source.relative_to(REPO).with_suffix(".html")
    assert page.exists(), f"the student edition has no page {page.relative_to(student_site)}"
    found = directives(markdown_of(source))
    text = page.read_text()
    shown_words = [w.lower() for w in page_words(page)]
    shown, shown_text = ngrams(shown_words), f" {' '.join(shown_words)} "
    problems = []
    for kind, arg, opts, body in found:
        body_grams = ngrams(words(body))
        if kind == "exercise":
            label = opts.get("label")
            if label and not re.search(rf'<div class="[^"]*\bexercise\b[^"]*"[^>]*\bid="{re.escape(label)}"', text):
                problems.append(f"exercise {label!r} ({arg}) is not an exercise admonition on the page")
            if arg and f" {' '.join(words(arg)).lower()} " not in shown_text:
                problems.append(f"exercise {label!r}: its title {arg!r} is not on the page")
            if body_grams and not body_grams & shown:
                problems.append(f"exercise {label!r}: none of its text is on the page")
        else:
            leaked = body_grams & shown
            if leaked:
                sample = " ".join(sorted(leaked)[0])
                problems.append(f"solution to {arg!r}: {len(leaked)} of its {len(body_grams)} runs of "
                                f"{NGRAM} words are on the page, e.g. {sample!r}")
    if re.search(r'class="[^"]*\bsolution\b', text):
        problems.append("the page has a solution admonition")
    assert not problems, f"{page.relative_to(student_site)} in the student edition:\n  " + "\n  ".join(problems)
