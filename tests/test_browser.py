"""The built site in a real browser (Debian's Chromium, headless): pages render, widgets show, nothing
is fetched from outside, and the console stays clean."""
import json
import os
from urllib.parse import urlparse

import pytest

from conftest import CHROMEDRIVER, CHROMIUM, QuietHandler, open_page  # noqa: F401 (the site and browser fixtures live there too)

pytestmark = pytest.mark.slow  # needs the built site

WIDGET_WAIT_S = 20

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    message = "Debian's chromium and chromium-driver are not installed (`make test` installs them)"
    if os.environ.get("CI"):
        raise RuntimeError(message)
    pytest.skip(message, allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def severe_console_entries(browser):
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def outside_requests(browser, site):
    """URLs the page asked for that are not on the local server (a CDN, a font service...)."""
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    local = urlparse(site).netloc
    return [u for u in urls if urlparse(u).scheme in ("http", "https", "ws", "wss")
            and urlparse(u).netloc != local]


def failed_local_requests():
    """Requests to the local server since the page was opened that found no file."""
    return [(code, path) for code, path in QuietHandler.requests if code not in (200, 304)]


def wait_for_images(browser):
    """Scroll each image into view (lazy loading) and wait until every one has finished loading."""
    browser.execute_script("for (const img of document.images) img.scrollIntoView();")
    WebDriverWait(browser, 30).until(
        lambda d: d.execute_script("return Array.from(document.images).every(i => i.complete)"))
    return browser.execute_script(
        "return Array.from(document.images).map(i => [i.currentSrc || i.src, i.naturalWidth])")


def visible_run_button(browser):
    for button in browser.find_elements(By.CSS_SELECTOR, ".widget-button, .jupyter-widgets button"):
        if button.text.strip() == "Run" and button.is_displayed():
            return button
    return False


def test_intro_page_loads_cleanly(browser, site):
    open_page(browser, f"{site}/book/intro.html")
    heading = browser.find_element(By.CSS_SELECTOR, "article h1")
    assert heading.is_displayed() and "measured" in heading.text
    assert "torch.compile, measured" in browser.title
    images = wait_for_images(browser)
    assert all(width > 0 for _, width in images), f"broken images: {[s for s, w in images if not w]}"
    outside = outside_requests(browser, site)
    assert not outside, f"requests outside the site: {outside}"
    assert not failed_local_requests(), f"files not found: {failed_local_requests()}"
    severe = severe_console_entries(browser)
    assert not severe, f"console errors: {severe}"


def test_chapter_pages_render(browser, site, chapters, repository_url, book_config):
    owner_repo = urlparse(repository_url).path.strip("/")
    branch = book_config["repository"].get("branch", "main")
    for chapter in chapters:
        open_page(browser, f"{site}/{chapter}.html")

        heading = browser.find_element(By.CSS_SELECTOR, "article h1")  # the chapter's, not the theme's
        title = heading.text.strip().rstrip("#").strip()
        assert heading.is_displayed() and title, f"{chapter}: no visible title"
        assert title in browser.title, f"{chapter}: <title> {browser.title!r} lacks the heading {title!r}"

        images = wait_for_images(browser)
        assert images, f"{chapter}: no images (a chapter plots what it measured)"
        broken = [src for src, width in images if not width]
        assert not broken, f"{chapter}: images that did not load: {broken}"

        try:
            WebDriverWait(browser, WIDGET_WAIT_S).until(visible_run_button)
        except Exception:
            pytest.fail(f"{chapter}: no widget with a visible Run button after {WIDGET_WAIT_S} s; "
                        f"console: {severe_console_entries(browser)}")

        colab = f"https://colab.research.google.com/github/{owner_repo}/blob/{branch}/{chapter}.ipynb"
        hrefs = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "a[href^='https://colab.']")]
        assert colab in hrefs, f"{chapter}: no Colab launch link {colab} (found {hrefs})"

        outside = outside_requests(browser, site)
        assert not outside, f"{chapter}: requests outside the site (a CDN?): {outside}"
        assert not failed_local_requests(), f"{chapter}: files not found: {failed_local_requests()}"
        severe = severe_console_entries(browser)
        assert not severe, f"{chapter}: console errors: {severe}"

