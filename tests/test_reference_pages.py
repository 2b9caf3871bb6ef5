"""The Reference part of the book: Myths and FAQ (book/myths.ipynb) and References (book/references.md).

The myths page answers every claim of the table "Claims that circulate, with verdicts" in the
project's FACTS.md, which sits beside the clone (../shared/FACTS.md; read-only in CI), each in a
row with a link. It is a notebook committed with its outputs: the invented flags fail in its cells,
caught and printed (a TypeError among them), so the notebook runs clean top to bottom and has no
error output. The references page lists every URL the book's pages link to. The slow tests re-run
the notebook, check the built pages' section links, and open both pages in headless Chromium.
"""
import html
import json
import re
from urllib.parse import urlparse

import pytest
import yaml

from conftest import REPO, QuietHandler, open_page

FACTS = REPO.parent / "shared" / "FACTS.md"
CLAIMS_HEADING = "## Claims that circulate, with verdicts"
MYTHS = REPO / "book" / "myths.ipynb"
REFERENCES = REPO / "book" / "references.md"
PAGES = ("book/myths", "book/references")
MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
URL = re.compile(r"https?://[^\s)>\]`\"'<]+")
INVENTED = ("regional", "reproducible", "fallback")  # keyword arguments torch.compile does not have


def table_rows(lines):
    """Cells of each body row of the first Markdown table in `lines` (header and separator left out)."""
    rows = []
    for line in lines:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows.append(cells)
    return [row for row in rows[1:] if not all(set(cell) <= set("-: ") for cell in row)]


def facts_claims():
    """First column of FACTS.md's table of circulating claims."""
    if not FACTS.exists():
        pytest.fail(f"{FACTS} not found: the myths page is checked against the table {CLAIMS_HEADING!r} "
                    "of the project's FACTS.md, which CI lays beside the clone in shared/")
    lines = FACTS.read_text().splitlines()
    if CLAIMS_HEADING not in lines:
        pytest.fail(f"{FACTS} has no heading {CLAIMS_HEADING!r}")
    claims = [row[0] for row in table_rows(lines[lines.index(CLAIMS_HEADING) + 1:])]
    assert claims, f"no claim rows found under {CLAIMS_HEADING!r} in {FACTS}"
    return claims


def notebook(path=MYTHS):
    return json.loads(path.read_text())


def markdown_of(path):
    if path.suffix == ".md":
        return path.read_text()
    return "\n\n".join("".join(c["source"]) for c in notebook(path)["cells"] if c["cell_type"] == "markdown")


def normalise(text):
    return " ".join(text.split())


def outputs_of(nb):
    return [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]


def stream_text(nb, name="stdout"):
    return "".join("".join(o["text"]) for o in outputs_of(nb) if o["output_type"] == "stream" and o["name"] == name)


# --- the table of claims ------------------------------------------------------------------------

def test_myths_page_answers_every_claim_with_a_link():
    rows = {normalise(row[0]): row for row in table_rows(markdown_of(MYTHS).splitlines())}
    claims = facts_claims()
    missing = [claim for claim in claims if normalise(claim) not in rows]
    assert not missing, f"claims of FACTS.md missing from the myths page's table: {missing}"
    for claim in claims:
        answer = " | ".join(rows[normalise(claim)][1:])
        assert re.match(r"\*\*[^*]+\*\*", answer), f"{claim!r}: the answer does not open with a bold verdict"
        assert MD_LINK.search(answer), f"{claim!r}: its row has no link"


def test_myths_links_point_at_pages_that_exist():
    """Relative links name real files (their section anchors are checked by the build, -n)."""
    for target in MD_LINK.findall(markdown_of(MYTHS)):
        if target.startswith(("http://", "https://", "#")):
            continue
        path = target.split("#")[0]
        assert (MYTHS.parent / path).exists(), f"the myths page links to {target}, which does not exist"


# --- the executed notebook ----------------------------------------------------------------------

def test_myths_notebook_is_committed_executed_without_errors():
    nb = notebook()
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c.get("execution_count") for c in code]
    assert counts == list(range(1, len(code) + 1)), \
        f"the code cells were not run once, top to bottom, in one kernel (execution counts {counts})"
    errors = [o for o in outputs_of(nb) if o["output_type"] == "error"]
    assert not errors, f"error outputs: {[(o['ename'], o['evalue']) for o in errors]}"
    stderr = stream_text(nb, "stderr")
    assert not stderr.strip(), f"stderr in the committed outputs (keep the noise out):\n{stderr[:2000]}"


def test_myths_notebook_shows_the_invented_flags_failing():
    printed = stream_text(notebook())
    assert "TypeError" in printed, "no TypeError in the outputs"
    for keyword in INVENTED:
        assert re.search(rf"TypeError: .*unexpected keyword argument '{keyword}'", printed), \
            f"the outputs do not show torch.compile(..., {keyword}=...) failing"
    assert re.search(r"Unrecognized mode=inductor", printed), "mode='inductor' is not shown failing"


def test_myths_page_says_which_torch_printed_the_errors():
    nb = notebook()
    glued = [o for o in outputs_of(nb)
             if o.get("metadata", {}).get("scrapbook", {}).get("name") == "torch_version"]
    assert glued, "the notebook does not glue torch_version"
    assert "{glue:text}`torch_version`" in markdown_of(MYTHS), "the text does not show the glued torch version"
    version = next(iter(glued[0]["data"].values())).strip("'\"")
    assert re.match(r"\d+\.\d+", version), version
    assert f"torch {version}" in stream_text(nb), "the printed version and the glued one differ"


# --- the references and the toc -----------------------------------------------------------------

def test_references_list_every_url_the_book_links_to(repository_url):
    """Every URL in the prose of the toc's pages (chapters included) is on the references page."""
    listed = set(URL.findall(REFERENCES.read_text()))
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    missing = {}
    for name in files:
        path = next((REPO / f"{name}{ext}" for ext in (".ipynb", ".md") if (REPO / f"{name}{ext}").exists()), None)
        if path is None or path == REFERENCES:
            continue
        for url in URL.findall(markdown_of(path)):
            url = url.rstrip(".,;:")
            if not url.startswith(repository_url) and url not in listed:
                missing.setdefault(url, []).append(name)
    assert not missing, f"URLs the book links to that book/references.md does not list: {missing}"


def test_reference_part_follows_chapters_in_the_toc():
    parts = yaml.safe_load((REPO / "_toc.yml").read_text())["parts"]
    captions = [p.get("caption") for p in parts]
    assert "Reference" in captions and "Chapters" in captions
    assert captions.index("Reference") == captions.index("Chapters") + 1, captions
    reference = parts[captions.index("Reference")]
    assert [c["file"] for c in reference["chapters"]] == list(PAGES)


# --- slow: re-run the notebook, the built pages, a browser --------------------------------------

@pytest.mark.slow
def test_myths_notebook_runs_clean_top_to_bottom(tmp_path):
    """A fresh run on this machine (CPU is enough) raises nothing and still shows the TypeErrors."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(MYTHS, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    ran = json.loads(nbformat.writes(nb))
    assert not [o for o in outputs_of(ran) if o["output_type"] == "error"]
    printed = stream_text(ran)
    for keyword in INVENTED:
        assert f"unexpected keyword argument '{keyword}'" in printed, printed[-2000:]


@pytest.mark.slow
def test_built_pages_link_to_sections_that_exist(built_site):
    """Every link from the two pages to a section of this site finds that section's id."""
    for page in PAGES:
        built = built_site / f"{page}.html"
        assert built.exists(), f"{page} was not built"
        broken = []
        for href in re.findall(r'<a\b[^>]*\bhref="([^"]+)"', built.read_text()):
            href = html.unescape(href)
            if urlparse(href).scheme or href.startswith("//"):
                continue
            path, _, fragment = href.partition("#")
            target = (built.parent / path).resolve() if path else built
            if not target.exists():
                broken.append(href)
            elif fragment and f'id="{fragment}"' not in target.read_text():
                broken.append(href)
        assert not broken, f"{page}: links to missing pages or sections: {broken}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_reference_page_loads_cleanly_in_a_browser(browser, site, page):
    from selenium.webdriver.common.by import By

    open_page(browser, f"{site}/{page}.html")

    heading = browser.find_element(By.CSS_SELECTOR, "article h1")
    assert heading.is_displayed() and heading.text.strip(), f"{page}: no visible title"
    article = browser.find_element(By.CSS_SELECTOR, "article").text
    if page == "book/myths":
        assert "TypeError" in article, "the myths page does not show the TypeErrors"
        assert "{glue" not in article, "a glue role was not replaced"

    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, f"{page}: console errors: {severe}"
    local = urlparse(site).netloc
    outside = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = urlparse(message["params"]["request"]["url"])
            if url.scheme in ("http", "https", "ws", "wss") and url.netloc != local:
                outside.append(url.geturl())
    assert not outside, f"{page}: requests outside the site: {outside}"
    not_found = [(code, path) for code, path in QuietHandler.requests if code not in (200, 304)]
    assert not not_found, f"{page}: files not found: {not_found}"
