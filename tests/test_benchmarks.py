"""The benchmarks page: generated at build time from results/<gpu>/*.json (utils/benchmarks.py, called by
the Sphinx extension book/_ext/benchmarks_page.py), with its explorers working in a browser.

Fast tests build the page's Markdown from the repository's results and from small results folders
made here (a broken, empty or missing file must stop the build with the file's name); the slow
test opens the built page in headless Chromium and changes an explorer's menu.
"""
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import REPO, QuietHandler, open_page, page_problems
from utils import benchmarks

FACTS = REPO.parent / "shared" / "FACTS.md"
SOURCES = REPO / "book" / "_data" / "benchmarks.yml"
NUMBER = re.compile(r"\d(?:\.\d+)?\s*(?:x\b|%|s\b)")  # a claim that quotes a speedup, a share or seconds


def load_extension():
    spec = importlib.util.spec_from_file_location("benchmarks_page_ext", REPO / "book" / "_ext" / "benchmarks_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_repo(tmp_path, files, chapters=("notebooks/01_a",)):
    """A repository with a toc listing `chapters`, results files {relative path: text} and the page's sources."""
    (tmp_path / "book" / "_data").mkdir(parents=True)
    shutil.copy(SOURCES, tmp_path / "book" / "_data" / "benchmarks.yml")
    toc = {"format": "jb-book", "root": "book/intro",
           "parts": [{"caption": "Chapters", "chapters": [{"file": c} for c in chapters]}]}
    (tmp_path / "_toc.yml").write_text(yaml.safe_dump(toc))
    for name, text in files.items():
        path = tmp_path / "results" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def results_text(rows, gpu="NVIDIA H200"):
    prov = {"gpu": gpu, "torch": "2.11.0+cu130", "python": "3.12", "date": "2026-12-04", "preset": "full"}
    return json.dumps({"provenance": prov, "measurements": rows})


GOOD = [{"workload": "step", "variant": "eager", "status": "ok", "median_ms": 4.0, "gpu_ms": 1.0, "speedup": 1.0},
        {"workload": "step", "variant": "default", "status": "ok", "median_ms": 2.0, "speedup": 2.0,
         "speedup_lo": 1.8, "speedup_hi": 2.3, "compile_s": 12.0, "peak_mem_gb": 1.5},
        {"workload": "step", "variant": "max-autotune", "status": "unfinished: still compiling"},
        {"workload": "decode", "variant": "eager", "status": "ok", "median_ms": 9.0, "speedup": 1.0},
        {"workload": "decode", "variant": "reduce-overhead", "status": "ok", "median_ms": 3.0, "speedup": 3.0,
         "compile_s": 20.0, "roofline_frac": 0.55}]


# --- the page from the repository's own results -------------------------------------------------

def test_page_has_every_results_file_and_the_best_recipe_of_each_workload():
    page = benchmarks.page_markdown(REPO)
    rows = benchmarks.gather(REPO / "results")
    for path in benchmarks.results_files(REPO / "results"):
        assert f"../notebooks/{path.stem}.ipynb" in page, f"{path} is not on the page"
    for best in benchmarks.headline(rows):
        page_link = f"(../notebooks/{Path(best['file']).stem}.ipynb)"  # two chapters may share a workload and recipe
        line = next((ln for ln in page.splitlines()
                     if page_link in ln and f"`{best['workload']}` | `{best['variant']}` |" in ln), None)
        assert line and f"{best['speedup']:.2f}x" in line, f"no headline row for {best['file']} {best['workload']}"
    for anchor in ("benchmarks-speedup", "benchmarks-compile", "benchmarks-regimes"):
        assert f'id="{anchor}"' in page


CHAPTER_RESULTS = [p for p in benchmarks.results_files(REPO / "results") if re.match(r"\d\d_", p.stem)]
FRACTIONS = ("floor_frac", "roofline_frac", "mfu_spec")  # floor time / recipe time, or the share of a roofline or peak


@pytest.mark.parametrize("path", CHAPTER_RESULTS, ids=[p.stem for p in CHAPTER_RESULTS])
def test_each_chapter_saves_its_floor_and_how_close_its_best_recipe_came(path):
    """A row with variant 'floor' for the headline workload, and a measured recipe of that workload with its fraction."""
    rows = json.loads(path.read_text())["measurements"]
    floors = [r for r in rows if r["variant"] == "floor" and r.get("status", "ok") == "ok"]
    assert floors, f"{path.name}: no floor row"
    for floor in floors:
        recipes = [r for r in rows if r["workload"] == floor["workload"] and r["variant"] != "floor"
                   and any(isinstance(r.get(f), (int, float)) for f in FRACTIONS)]
        assert recipes, f"{path.name}: nothing of {floor['workload']!r} says how close it came to its floor"


def test_headline_is_the_fastest_compiled_variant_with_dashes_for_what_was_not_measured(tmp_path):
    repo = make_repo(tmp_path, {"h200/01_a.json": results_text(GOOD)})
    page = benchmarks.page_markdown(repo)
    assert "| `step` | `default` | 2.00x (1.80-2.30) | 12.0 | - | 1.50 |" in page
    assert "| `decode` | `reduce-overhead` | 3.00x | 20.0 | 0.55 of roofline | - |" in page
    assert "max-autotune" not in page.split("## Compile time")[0].split("| chapter |")[1], \
        "an unfinished variant is not a recipe"
    regimes = {r["workload"]: r["regime"] for r in benchmarks.with_regime(benchmarks.gather(repo / "results"))}
    assert regimes == {"step": benchmarks.OVERHEAD, "decode": benchmarks.UNKNOWN}


def test_a_companion_nested_under_its_chapter_is_on_the_page_and_needs_its_results(tmp_path):
    repo = make_repo(tmp_path, {"h200/01_a.json": results_text(GOOD), "h200/01b_c.json": results_text(GOOD)})
    toc = yaml.safe_load((repo / "_toc.yml").read_text())
    toc["parts"][0]["chapters"] = [{"file": "notebooks/01_a", "sections": [{"file": "notebooks/01b_c"}]}]
    (repo / "_toc.yml").write_text(yaml.safe_dump(toc))
    assert benchmarks.toc_chapters(repo) == ["notebooks/01_a", "notebooks/01b_c"]
    assert "[1b](../notebooks/01b_c.ipynb)" in benchmarks.page_markdown(repo)
    (repo / "results" / "h200" / "01b_c.json").unlink()
    with pytest.raises(benchmarks.ResultsError, match="01b_c.json"):
        benchmarks.page_markdown(repo)


def test_every_gpu_folder_is_read_and_gets_a_menu(tmp_path):
    repo = make_repo(tmp_path, {"h200/01_a.json": results_text(GOOD),
                                "a100/01_a.json": results_text(GOOD[:2], gpu="NVIDIA A100"),
                                "cpu/01_a.json": "not read: CPU runs are not results of record"})
    page = benchmarks.page_markdown(repo)
    assert "NVIDIA A100" in page and "NVIDIA H200" in page
    spec = json.loads(re.search(r'id="benchmarks-speedup".*?spec = (\{.*?\});\n', page, re.S).group(1))
    assert [p["bind"]["name"].strip() for p in spec["params"]] == ["chapter", "gpu"]


@pytest.mark.parametrize("text, says", [
    ("", "empty"),
    ("{\"provenance\": {}, \"measurements\": [", "not valid JSON"),
    ("[1, 2]", "not a results file"),
    (json.dumps({"provenance": {"gpu": "x"}, "measurements": []}), "no measurements"),
    (json.dumps({"provenance": {"gpu": "x"}, "measurements": [{"variant": "eager"}]}), "lacks 'workload'"),
], ids=["empty", "broken-json", "not-a-dict", "no-measurements", "row-without-workload"])
def test_a_bad_results_file_stops_the_build_naming_it(tmp_path, text, says):
    repo = make_repo(tmp_path, {"h200/01_a.json": results_text(GOOD), "h200/02_b.json": text})
    with pytest.raises(benchmarks.ResultsError) as caught:
        benchmarks.page_markdown(repo)
    assert "results/h200/02_b.json" in str(caught.value) and says in str(caught.value)
    # the same through the Sphinx extension: an ExtensionError, which fails the build
    from sphinx.errors import ExtensionError

    with pytest.raises(ExtensionError, match=r"results/h200/02_b\.json"):
        load_extension().generate(SimpleNamespace(srcdir=str(repo)))
    assert not (repo / "book" / "benchmarks.md").exists()


def test_a_chapter_without_results_stops_the_build_naming_the_file(tmp_path):
    repo = make_repo(tmp_path, {"h200/01_a.json": results_text(GOOD)}, chapters=("notebooks/01_a", "notebooks/02_b"))
    with pytest.raises(benchmarks.ResultsError, match=r"results/<gpu>/02_b\.json"):
        benchmarks.page_markdown(repo)
    empty = make_repo(tmp_path / "empty", {})
    with pytest.raises(benchmarks.ResultsError, match=r"01_a\.json"):
        benchmarks.page_markdown(empty)


def test_the_extension_writes_the_page_where_the_toc_expects_it(tmp_path):
    repo = make_repo(tmp_path, {"h200/01_a.json": results_text(GOOD)})
    path = load_extension().generate(SimpleNamespace(srcdir=str(repo)))
    assert path == repo / "book" / "benchmarks.md" and path.read_text().startswith("# Benchmarks")
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    reference = next(p for p in toc["parts"] if p["caption"] == "Reference")
    assert reference["chapters"][0]["file"] == "book/benchmarks", "the benchmarks page opens the Reference part"


def test_the_generated_page_is_git_ignored_and_the_extension_registered():
    ignored = subprocess.run(["git", "check-ignore", "-q", "book/benchmarks.md"], cwd=REPO)
    assert ignored.returncode == 0, "book/benchmarks.md is generated: it must be git-ignored"
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    assert {"benchmarks_page", "explorers"} <= set(config["sphinx"]["local_extensions"])


# --- what the page quotes from others -----------------------------------------------------------

def test_numeric_claims_of_facts_are_on_the_page():
    if not FACTS.exists():
        pytest.fail(f"{FACTS} not found (CI lays the project's shared/ beside the clone)")
    lines = FACTS.read_text().splitlines()
    start = lines.index("## Claims that circulate, with verdicts")
    table = [ln for ln in lines[start:] if ln.startswith("|")]
    claims = [ln.strip("|").split("|")[0].strip() for ln in table[2:]]
    numeric = [c for c in claims if NUMBER.search(c)]
    assert len(numeric) >= 5, numeric
    listed = {c["claim"] for c in yaml.safe_load(SOURCES.read_text())["claims"]}
    assert not set(numeric) - listed, f"claims with numbers missing from {SOURCES.name}: {set(numeric) - listed}"


def test_sources_are_cited_with_hardware_and_listed_in_the_references():
    sources = yaml.safe_load(SOURCES.read_text())
    references = (REPO / "book" / "references.md").read_text()
    for item in sources["published"]:
        assert item.get("hardware") and item.get("figure"), item
        assert item["url"] in references, f"{item['url']} is not on book/references.md"
    for claim in sources["claims"]:
        for url in re.findall(r"\]\((https?://[^)]+)\)", claim.get("truth", "")):
            assert url in references, f"{url} is not on book/references.md"
        if claim.get("chapter"):
            assert (REPO / "notebooks" / f"{claim['chapter']}.ipynb").exists(), claim["chapter"]


# --- slow: the built page in a browser ----------------------------------------------------------

def svg_text(browser, element_id):
    return browser.execute_script(
        "const svg = document.querySelector(arguments[0] + ' svg');"
        "return svg ? Array.from(svg.querySelectorAll('text')).map(t => t.textContent).join('|') : null;",
        f"#{element_id}")


@pytest.mark.slow
def test_benchmarks_page_explorers_change_with_their_menu_offline(browser, site):
    from selenium.webdriver.support.ui import Select, WebDriverWait

    open_page(browser, f"{site}/book/benchmarks.html")
    for element_id in ("benchmarks-speedup", "benchmarks-compile", "benchmarks-regimes"):
        WebDriverWait(browser, 30).until(lambda d: svg_text(d, element_id), f"{element_id} drew no chart")
    before = svg_text(browser, "benchmarks-speedup")
    menu = Select(browser.find_element("css selector", "#benchmarks-speedup select"))
    choices = [o.get_attribute("value") for o in menu.options]
    assert choices[0] == "all" and len(choices) > 2, choices
    menu.select_by_value(choices[1])
    WebDriverWait(browser, 10).until(lambda d: svg_text(d, "benchmarks-speedup") != before,
                                     "the chart did not change with the menu")
    after = svg_text(browser, "benchmarks-speedup")
    assert choices[1] in after and len(after) < len(before), "picking one chapter should show only its bars"
    others = [c for c in choices[2:] if f"{c} ·" in before]
    assert others and not any(f"{c} ·" in after for c in others), "other chapters' bars are still shown"

    problems = page_problems(browser, site)
    assert not any(problems.values()), problems
    assert any(path.split("?")[0].endswith("/vega/vega-embed.min.js") for _, path in QuietHandler.requests), \
        "vega-embed was not served by the site"


@pytest.mark.slow
def test_chapter_explorers_draw_on_their_pages(browser, site, chapters):
    """Every explorer a chapter's committed outputs hold draws a chart with the site's own Vega."""
    from selenium.webdriver.support.ui import WebDriverWait

    for chapter in chapters:
        open_page(browser, f"{site}/{chapter}.html")
        ids = browser.execute_script("return Array.from(document.querySelectorAll('.book-explorer')).map(e => e.id)")
        for element_id in ids:
            WebDriverWait(browser, 30).until(lambda d: svg_text(d, element_id), f"{chapter}: {element_id} drew nothing")
        severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, f"{chapter}: console errors: {severe}"


@pytest.mark.slow
def test_every_chapter_has_an_explorer_that_a_menu_changes(browser, site, chapters):
    """Each chapter's page (not its companion pages) holds an explorer of its results that redraws when a menu changes."""
    from selenium.webdriver.support.ui import Select, WebDriverWait

    main_chapters = [c for c in chapters if re.fullmatch(r"\d+_[a-z_]+", Path(c).name)]
    assert len(main_chapters) >= 5, main_chapters
    for chapter in main_chapters:
        open_page(browser, f"{site}/{chapter}.html")
        ids = browser.execute_script("return Array.from(document.querySelectorAll('.book-explorer')).map(e => e.id)")
        assert ids, f"{chapter}: no explorer on the page"
        element_id = ids[0]
        WebDriverWait(browser, 30).until(lambda d: svg_text(d, element_id), f"{chapter}: {element_id} drew nothing")
        before = svg_text(browser, element_id)
        menu = Select(browser.find_element("css selector", f"#{element_id} select"))
        choices = [o.get_attribute("value") for o in menu.options]
        assert len(choices) > 1, f"{chapter}: the explorer's menu offers one choice: {choices}"
        menu.select_by_value(choices[1] if menu.first_selected_option.get_attribute("value") == choices[0]
                             else choices[0])
        WebDriverWait(browser, 10).until(lambda d: svg_text(d, element_id) != before,
                                         f"{chapter}: the chart did not change with its menu")
        severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, f"{chapter}: console errors: {severe}"
