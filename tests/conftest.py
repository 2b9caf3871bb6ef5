"""Shared set-up for the test suite: one inductor cache, the repository's layout, the built site."""
import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# One compile cache for the whole session, set before anything imports torch, so that the
# notebook kernels papermill starts (they inherit this environment) share it with each other
# and with the library tests. /.cache/ is git-ignored.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".cache" / "inductor"))
# Under pytest-xdist, each worker (and the notebook kernels it starts) gets its share of the cores for
# torch's threads: OpenMP threads that outnumber the cores spin against each other and slow every worker.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
# Cora and CiteSeer's raw files, laid beside the checkout for tests and CI (read-only there:
# utils.gnn.load_cora reads a temporary copy of a folder it cannot write to).
SHARED_PLANETOID = REPO.parent / "shared" / "data" / "planetoid"
if SHARED_PLANETOID.is_dir():
    os.environ.setdefault("PLANETOID_ROOT", str(SHARED_PLANETOID))
if str(REPO) not in sys.path:  # `import utils` from the repository, however pytest is started
    sys.path.insert(0, str(REPO))

import pytest  # noqa: E402
import yaml  # noqa: E402

BUILD_CMD = ["build", ".", "--all", "-W", "-n", "--keep-going"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# `make test` runs the suite on pytest-xdist workers (two per core, at most 4). A unit of work goes to one worker whole: the
# modules that use the built site or the browser (built and started once), each notebook's smoke run, and
# each other module (its module fixtures, a server or a torchrun, are set up once).
SITE_FIXTURES = {"built_site", "site", "browser", "student_build", "student_site"}
SITE_MODULES = {"test_benchmarks.py", "test_book.py", "test_browser.py", "test_reference_pages.py", "test_student.py",
                "test_workshop.py"}


def work_unit(nodeid):
    """The unit of work a test belongs to, from its node id (e.g. 'test_book.py::test_x' -> 'site')."""
    module = nodeid.split("::")[0].rsplit("/", 1)[-1]
    if "smoke_preset" in nodeid:
        return nodeid
    return "site" if module in SITE_MODULES else module


# Seconds each smoke run took in CI (make test on the 2-core machine, 4 workers, 2026-12-07): the longest start first,
# so that the workers end together. A smoke run not listed here starts after the listed ones.
SMOKE_SECONDS = {"test_deployment.py": 844, "[05_diffusion]": 732, "[05b_diffusion_serving]": 655, "[02_training]": 617,
                 "test_tuning.py::test_draft_runs_in_smoke_preset_on_cpu[float32]": 477, "[04_gnn]": 371,
                 "[03_inference]": 363, "test_tuning.py::test_draft_runs_in_smoke_preset_on_cpu[bfloat16]": 274}


def expected_seconds(nodeid):
    """How long a smoke run took in CI (SMOKE_SECONDS), 1 for one not listed, 0 for any other test."""
    if "smoke_preset" not in nodeid:
        return 0
    return max((seconds for key, seconds in SMOKE_SECONDS.items() if key in nodeid), default=1)


def pytest_collection_modifyitems(config, items):
    """The notebook smoke runs first, the longest first; and a test that uses the built site must live in one of
    SITE_MODULES, or two workers would build it at once."""
    items.sort(key=lambda item: -expected_seconds(item.nodeid))  # stable: the rest keep their order
    strays = [item.nodeid for item in items
              if SITE_FIXTURES & set(item.fixturenames) and work_unit(item.nodeid) != "site"]
    if strays:
        raise pytest.UsageError(f"tests using the built site outside SITE_MODULES (tests/conftest.py): {strays}")


try:
    import xdist.scheduler
except ImportError:  # a plain `pytest` run, without pytest-xdist
    pass
else:
    def pytest_xdist_make_scheduler(config, log):
        """xdist's scheduling by scope, with this suite's units of work (work_unit)."""
        class ByWorkUnit(xdist.scheduler.LoadScopeScheduling):
            def _split_scope(self, nodeid):
                return work_unit(nodeid)
        # xdist would otherwise hand out the units with the most tests first, leaving the smoke runs (one test each) for last
        config.option.loadscopereorder = False
        return ByWorkUnit(config, log)


@pytest.fixture(scope="session")
def repo():
    """The repository's root folder."""
    return REPO


@pytest.fixture(scope="session")
def book_config():
    """_config.yml, parsed."""
    return yaml.safe_load((REPO / "_config.yml").read_text())


@pytest.fixture(scope="session")
def repository_url(book_config):
    """The book's repository URL: it lives in _config.yml and nowhere else."""
    return book_config["repository"]["url"].rstrip("/")


def toc_chapters():
    """The chapter files listed in _toc.yml's 'Chapters' part, companion pages nested under a chapter included."""
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    parts = [p for p in toc.get("parts", []) if p.get("caption") == "Chapters"]
    return [f for p in parts for c in p.get("chapters", []) for f in [c["file"], *(s["file"] for s in c.get("sections", []))]]


@pytest.fixture(scope="session")
def chapters():
    """Chapter files from the toc; a toc with no chapter is a failure, not an empty test."""
    files = toc_chapters()
    assert files, "_toc.yml lists no chapter under the 'Chapters' part"
    return files


@pytest.fixture(scope="session")
def built_site():
    """Build the site once per session, from scratch, with warnings as errors; returns _build/html.

    `--all` rebuilds every page: an incremental build would not repeat the warnings of pages
    that did not change, and could pass on a broken book.
    """
    vendored = [REPO / "book" / "_vendor" / f for f in ("widgets/embed-amd.js", "mathjax/tex-mml-chtml.js",
                                                          "vega/vega-embed.min.js")]
    if not all(path.exists() for path in vendored):
        pytest.fail("the site's JavaScript is not vendored into book/_vendor/: run `make test` "
                    "(or `make book`), which fetches it")
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jupyter_book) if jupyter_book.exists() else "jupyter-book", *BUILD_CMD]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    log = ANSI.sub("", proc.stdout + proc.stderr)
    (REPO / "_build").mkdir(exist_ok=True)
    (REPO / "_build" / "build.log").write_text(log)
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert proc.returncode == 0, f"jupyter-book {' '.join(BUILD_CMD)} exited {proc.returncode}:\n" + \
        "\n".join(warnings or log.splitlines()[-40:])
    assert not warnings, "the build printed warnings:\n" + "\n".join(warnings)
    html = REPO / "_build" / "html"
    assert (html / "index.html").exists()
    return html


# --- the built site in headless Chromium (tests/test_browser.py, tests/test_reference_pages.py) ---

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site and records (status, path) of every request instead of logging it."""
    requests = []

    def log_request(self, code="-", size="-"):
        self.requests.append((int(code) if str(code).isdigit() else code, self.path))

    def log_message(self, *args):
        pass


def serve(directory):
    """Serve `directory` on a free loopback port in a thread; yields its URL, then stops (for session fixtures)."""
    handler = functools.partial(QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def site(built_site):
    """The built site served on a free loopback port; its URL."""
    QuietHandler.requests = []
    yield from serve(built_site)


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """Headless Chromium with its console and network logs kept; a failure in CI when it is missing."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        message = "Debian's chromium and chromium-driver are not installed (`make test` installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1280,1024",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    driver.execute_cdp_cmd("Network.enable", {})  # no HTTP cache: every page fetches its files from the site,
    driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})  # whichever test opened it first
    yield driver
    driver.quit()


def build_small_sphinx(repo, extensions, warning=None):
    """Build the Sphinx project in `repo` (its pages already written) with the book's extensions named; its _build folder.

    conf.py is written here: book/_ext on the path, `extensions`, and _build, notebooks and results
    left out of the sources. Warnings go to the `warning` stream (None: dropped).
    """
    from sphinx.application import Sphinx
    from sphinx.util.docutils import docutils_namespace, patch_docutils

    (repo / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(REPO / 'book' / '_ext')!r})\n"
                                  f"extensions = {list(extensions)!r}\n"
                                  "exclude_patterns = ['_build', 'notebooks', 'results']\n")
    with patch_docutils(str(repo)), docutils_namespace():  # as sphinx-build does: roles and directives undone after
        app = Sphinx(str(repo), str(repo), str(repo / "_build"), str(repo / "_build" / ".doctrees"), "html",
                     status=None, warning=warning, freshenv=True)
        app.build()
    return repo / "_build"


def open_page(browser, url):
    """Load a page, wait for it to finish, and drop log entries and requests left from earlier pages."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser")
    browser.get_log("performance")
    QuietHandler.requests = []
    browser.get(url)
    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")


def page_problems(browser, site):
    """What the page just opened did wrong: console errors, requests that left the site, files not found."""
    import json
    from urllib.parse import urlparse

    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    local = urlparse(site).netloc
    outside = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = urlparse(message["params"]["request"]["url"])
            if url.scheme in ("http", "https", "ws", "wss") and url.netloc != local:
                outside.append(url.geturl())
    not_found = [(code, path) for code, path in QuietHandler.requests if code not in (200, 304)]
    return {"console errors": severe, "requests outside the site": outside, "files not found": not_found}
