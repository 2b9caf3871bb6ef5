# Two commands, each setting up what it needs first (idempotent, fast once set up):
#   make book   build the static site into _build/html
#   make test   run the test suite (library, notebook smoke runs on CPU, site build, browser), on two
#               pytest-xdist workers per core, at most 4 (tests/conftest.py: the units of work)
#   make test-fast   the same without the tests marked slow (notebook smoke runs, site build, browser)
# and for workshops:
#   make student   the same site without the exercises' solutions, into _build/student/html
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := book

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# pip runs only when a requirements file is newer than this stamp
STAMP := $(VENV)/.requirements.stamp
# --all: Sphinx does not repeat the warnings of pages it does not rebuild, so an incremental
# build could pass over a broken page; the book is small enough to rebuild whole.
JB_FLAGS := --all -W -n --keep-going

# JavaScript the site serves itself, vendored from the npm registry (pinned versions, checked
# checksums) into book/_vendor/ (git-ignored), so that pages need no CDN: the widget manager
# (see _config.yml: html_static_path and nb_ipywidgets_js) and MathJax (mathjax_path).
VENDOR := book/_vendor/widgets
MATHJAX_DIR := book/_vendor/mathjax
HTML_MANAGER := @jupyter-widgets/html-manager@1.0.6
HTML_MANAGER_TGZ := jupyter-widgets-html-manager-1.0.6.tgz
HTML_MANAGER_URL := https://registry.npmjs.org/@jupyter-widgets/html-manager/-/html-manager-1.0.6.tgz
HTML_MANAGER_SHA256 := 6c198ceb99ba7e7526990a1de16e8147ad7d3a714e3fb06741183623c04b5f6e
REQUIREJS := requirejs@2.3.8
REQUIREJS_TGZ := requirejs-2.3.8.tgz
REQUIREJS_URL := https://registry.npmjs.org/requirejs/-/requirejs-2.3.8.tgz
REQUIREJS_SHA256 := 777158e89275e16bd51aec3ef714fbcb5dc45789e7078659933bc814916d7dec
# Sphinx loads MathJax from a CDN by default.
MATHJAX := mathjax@3.2.2
MATHJAX_TGZ := mathjax-3.2.2.tgz
MATHJAX_URL := https://registry.npmjs.org/mathjax/-/mathjax-3.2.2.tgz
MATHJAX_SHA256 := 1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09
# Vega, Vega-Lite and vega-embed: the explorers (utils/explore.py) and the benchmarks page draw their
# charts with them in the browser, no kernel needed. Their UMD builds are loaded as plain scripts
# before require.js (book/_ext/explorers.py), so they define globals, not AMD modules. The Vega-Lite
# schema goes to .cache/ for the tests that validate the explorers' specs (not onto the site).
VEGA_DIR := book/_vendor/vega
VEGA_SCHEMA := .cache/vega-lite-schema.json
VEGA := vega@6.4.0
VEGA_TGZ := vega-6.4.0.tgz
VEGA_URL := https://registry.npmjs.org/vega/-/vega-6.4.0.tgz
VEGA_SHA256 := 3521fb6ff68a94a40323954f0ba4484ba4014b157bfd37f89a3b063082320c42
VEGA_LITE := vega-lite@6.5.0
VEGA_LITE_TGZ := vega-lite-6.5.0.tgz
VEGA_LITE_URL := https://registry.npmjs.org/vega-lite/-/vega-lite-6.5.0.tgz
VEGA_LITE_SHA256 := 811230a6bfd2cdbfc359d0c38f624a90df86657b7f251b67be88bcc4eee32b7f
VEGA_EMBED := vega-embed@7.3.0
VEGA_EMBED_TGZ := vega-embed-7.3.0.tgz
VEGA_EMBED_URL := https://registry.npmjs.org/vega-embed/-/vega-embed-7.3.0.tgz
VEGA_EMBED_SHA256 := d9a958ced3240f0418df7d5e12e97dba6e63cecda15b8403e47a0db7eb6ea859

.PHONY: book student test test-fast setup browser clean

book: setup
	$(VENV)/bin/jupyter-book build . $(JB_FLAGS)

# The student edition: sphinx-exercise's hide_solutions = True on top of _config.yml. jupyter-book
# 1.x has no command-line override for one Sphinx setting (`build --config` replaces _config.yml
# whole, and `--path-output` writes to <path>/_build/html), so this calls the function its `build`
# command calls, with the same flags as `make book` (--all -W -n --keep-going) and one more
# override. Its doctrees go to _build/student/.doctrees, apart from the main site's.
STUDENT_HTML := _build/student/html
student: setup
	$(PY) -c 'import sys; from pathlib import Path; from jupyter_book.sphinx import build_sphinx; \
	src = Path.cwd(); \
	sys.exit(build_sphinx(src, src / "$(STUDENT_HTML)", noconfig=True, path_config=src / "_config.yml", \
	    confoverrides={"external_toc_path": (src / "_toc.yml").as_posix(), "latex_individualpages": False, \
	                   "nitpicky": True, "hide_solutions": True}, \
	    freshenv=True, warningiserror=True, keep_going=True))'
	@echo "student edition (no solutions): $(STUDENT_HTML)/index.html"

# Two workers per core: a notebook smoke run spends much of its time in one thread (Dynamo's tracing) or
# waiting on the processes it starts, so one worker per core leaves cores idle (on 2 cores: 35 minutes
# with 2 workers, 28 with 4).
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(min(4, 2 * (os.cpu_count() or 1)))')
test: setup browser
	$(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) tests

# Library and runner tests, in minutes: no notebook smoke run, site build or browser (tests/pytest.ini: slow).
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow" tests

setup: $(STAMP) $(VENDOR)/.stamp $(VEGA_DIR)/.stamp

# pip byte-compiles what it installs: keep it (no --no-compile). Where PYTHONDONTWRITEBYTECODE is set, as on
# the CI machine, Python never writes .pyc files itself, and every process would compile torch from source.
$(STAMP): requirements.txt tests/requirements.txt
	@test -x $(PY) || { echo "creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q -r requirements.txt -r tests/requirements.txt
	@touch $@

$(VENDOR)/.stamp: Makefile
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	if command -v npm >/dev/null; then \
	  (cd "$$tmp" && npm pack --silent $(HTML_MANAGER) $(REQUIREJS) $(MATHJAX) >/dev/null); \
	else \
	  for url in $(HTML_MANAGER_URL) $(REQUIREJS_URL) $(MATHJAX_URL); do \
	    curl -fsSL -o "$$tmp/$$(basename $$url | sed 's/^html-manager/jupyter-widgets-html-manager/')" $$url; \
	  done; \
	fi; \
	printf '%s  %s\n' $(HTML_MANAGER_SHA256) "$$tmp/$(HTML_MANAGER_TGZ)" $(REQUIREJS_SHA256) "$$tmp/$(REQUIREJS_TGZ)" \
	  $(MATHJAX_SHA256) "$$tmp/$(MATHJAX_TGZ)" | sha256sum -c --quiet -; \
	mkdir -p "$$tmp/hm" "$$tmp/rq" "$$tmp/mj"; \
	tar -xzf "$$tmp/$(HTML_MANAGER_TGZ)" -C "$$tmp/hm"; \
	tar -xzf "$$tmp/$(REQUIREJS_TGZ)" -C "$$tmp/rq"; \
	tar -xzf "$$tmp/$(MATHJAX_TGZ)" -C "$$tmp/mj"; \
	rm -rf $(VENDOR) $(MATHJAX_DIR); mkdir -p $(VENDOR) $(MATHJAX_DIR); \
	cp "$$tmp"/hm/package/dist/embed-amd.js "$$tmp"/hm/package/dist/*.{woff,woff2,ttf,eot,svg} $(VENDOR)/; \
	cp "$$tmp"/hm/package/LICENSE $(VENDOR)/LICENSE.html-manager; \
	cp "$$tmp"/rq/package/require.js $(VENDOR)/require.js; \
	cp -r "$$tmp"/mj/package/es5/{tex-mml-chtml.js,input,output,ui,a11y,sre} "$$tmp"/mj/package/LICENSE $(MATHJAX_DIR)/; \
	echo "$(HTML_MANAGER) $(REQUIREJS) $(MATHJAX)" > $@; \
	echo "vendored $(HTML_MANAGER), $(REQUIREJS) and $(MATHJAX) into book/_vendor/"

$(VEGA_DIR)/.stamp: Makefile
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	if command -v npm >/dev/null; then \
	  (cd "$$tmp" && npm pack --silent $(VEGA) $(VEGA_LITE) $(VEGA_EMBED) >/dev/null); \
	else \
	  for url in $(VEGA_URL) $(VEGA_LITE_URL) $(VEGA_EMBED_URL); do curl -fsSL -o "$$tmp/$$(basename $$url)" $$url; done; \
	fi; \
	printf '%s  %s\n' $(VEGA_SHA256) "$$tmp/$(VEGA_TGZ)" $(VEGA_LITE_SHA256) "$$tmp/$(VEGA_LITE_TGZ)" \
	  $(VEGA_EMBED_SHA256) "$$tmp/$(VEGA_EMBED_TGZ)" | sha256sum -c --quiet -; \
	for name in vega vega-lite vega-embed; do mkdir -p "$$tmp/$$name"; done; \
	tar -xzf "$$tmp/$(VEGA_TGZ)" -C "$$tmp/vega"; \
	tar -xzf "$$tmp/$(VEGA_LITE_TGZ)" -C "$$tmp/vega-lite"; \
	tar -xzf "$$tmp/$(VEGA_EMBED_TGZ)" -C "$$tmp/vega-embed"; \
	rm -rf $(VEGA_DIR); mkdir -p $(VEGA_DIR) $$(dirname $(VEGA_SCHEMA)); \
	for name in vega vega-lite vega-embed; do \
	  cp "$$tmp/$$name"/package/build/$$name.min.js* $(VEGA_DIR)/; \
	  cp "$$tmp/$$name"/package/LICENSE $(VEGA_DIR)/LICENSE.$$name; \
	done; \
	cp "$$tmp"/vega-lite/package/build/vega-lite-schema.json $(VEGA_SCHEMA); \
	echo "$(VEGA) $(VEGA_LITE) $(VEGA_EMBED)" > $@; \
	echo "vendored $(VEGA), $(VEGA_LITE) and $(VEGA_EMBED) into $(VEGA_DIR)/"

# Debian's Chromium and ChromeDriver for tests/test_browser.py, installed only when missing.
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	fi

clean:
	rm -rf _build book/_vendor
