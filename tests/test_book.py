"""The static site: it builds with warnings as errors, has a page per chapter, loads no widget JS from a CDN."""
import re

import pytest

from conftest import REPO, toc_chapters

SCRIPT_SRC = re.compile(r"""<script\b[^>]*\bsrc=["']([^"']+)["']""", re.I)
WIDGET_JS = ("_static/widgets/require.js", "_static/widgets/embed-amd.js")


def test_toc_chapters_are_the_notebooks():
    """Every chapter in the toc exists, and every chapter notebook is in the toc."""
    listed = toc_chapters()
    on_disk = sorted(f"notebooks/{p.stem}" for p in (REPO / "notebooks").glob("[0-9]*.ipynb"))
    assert listed, "_toc.yml lists no chapter"
    missing = [f for f in listed if not (REPO / f"{f}.ipynb").exists()]
    assert not missing, f"in _toc.yml but not on disk: {missing}"
    assert sorted(listed) == on_disk, f"notebooks not in _toc.yml: {sorted(set(on_disk) - set(listed))}"


@pytest.mark.slow
def test_build_passes_with_warnings_as_errors(built_site):
    """The fixture asserts exit 0 and no WARNING line; here, the pages it must have written."""
    for page in ("book/intro.html", "book/how-to-run.html", "index.html", "search.html"):
        assert (built_site / page).exists(), f"{page} was not built"


@pytest.mark.slow
def test_each_chapter_has_a_page(built_site, chapters):
    for chapter in chapters:
        page = built_site / f"{chapter}.html"
        assert page.exists(), f"no page for {chapter}"
        html = page.read_text()
        assert re.search(r"<h1\b", html), f"{chapter}: the page has no title"
        assert "highlight-ipython3" in html or "cell_input" in html, f"{chapter}: no code cells rendered"


@pytest.mark.slow
def test_widget_js_is_vendored_not_fetched_from_a_cdn(built_site, chapters):
    for js in WIDGET_JS:
        path = built_site / js
        assert path.exists() and path.stat().st_size > 10_000, f"{js} is missing: run `make book`"
    for chapter in chapters:
        html = (built_site / f"{chapter}.html").read_text()
        sources = SCRIPT_SRC.findall(html)
        remote = [s for s in sources if re.match(r"(https?:)?//", s)]
        assert not remote, f"{chapter} loads scripts from the network: {remote}"
        for js in WIDGET_JS:
            assert any(s.split("?")[0].endswith(js) for s in sources), f"{chapter} does not load {js}"


@pytest.mark.slow
def test_gpu_cpu_note_is_included(built_site):
    for page in ("book/intro.html", "book/how-to-run.html"):
        html = (built_site / page).read_text()
        assert "GPU or CPU: the two presets" in html, f"{page} lacks the GPU/CPU note"
