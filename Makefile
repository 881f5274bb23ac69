# LLM Training Lab. A newcomer needs two commands: `make lab` and `make test`.
PYTHON ?= python3
PROFILE ?= auto
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv lab test smoke browser book bench gpu-results screenshot clean

# (Re)install whenever the pinned requirements or the package metadata change. Every package must be byte-compiled:
# without .pyc files every process compiles what it imports, every time where PYTHONDONTWRITEBYTECODE is set, as on
# this lab's machines (8.2 s instead of 4.0 s to import the lab's packages; a make test of 22 minutes instead of 15).
# pip compiles on one core; compileall compiles the same files on every core: installs of 61 and 71 s against pip's
# 70 and 80 s here, run alternately.
# A few files written for a newer Python (torch's py312 test helper) do not compile, under pip or here: skipped.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -r requirements.txt
	$(PY) -m pip install --quiet --no-compile --no-deps --no-build-isolation -e .
	$(PY) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"
	touch $(STAMP)

venv: $(STAMP)

# JupyterLab on localhost only, token authentication left on (the URL with the token is printed).
# As root (containers), Jupyter refuses to start unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--ServerApp.allow_root=True)
lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=notebooks $(ROOT_FLAG)

# Unit and parity tests, and beside them every notebook executed with PROFILE="smoke" in JupyterLab, driven by a
# headless Chromium that also moves every panel's controls (tests/suite.py says how the two share the machine).
# This is what CI runs. `$(PY) -m pytest` runs the same tests one after the other.
test: $(STAMP) browser
	$(PY) -m compileall -q -j 0 labtools lessons  # the lab's own code, compiled once rather than in every process
	$(PY) tests/suite.py

# Only the notebooks (smoke profile, in the browser).
smoke: $(STAMP) browser
	$(PY) -m pytest -m notebook

# A Chromium for the browser tests: one on PATH or Playwright's, else installed (apt-get as root on Debian/Ubuntu,
# `playwright install chromium` elsewhere); fails with instructions when none can be had.
browser: $(STAMP)
	$(PY) tests/jupyter_browser.py

# Execute every notebook (PROFILE=auto by default; `make book PROFILE=smoke` for a quick one) and render it to HTML
# in build/book/, with an index, the notation page and "Claims, measured"; offline (plotly.js embedded, MathJax
# copied beside the pages). labtools/book.py; tests/test_book.py builds one lesson and opens it offline.
book: $(STAMP)
	$(PY) -m labtools.book --profile $(PROFILE)
	@echo "open build/book/*.html"

# The README's picture (docs/lesson.png): lesson 02's first panel, photographed by the browser test.
screenshot: $(STAMP) browser
	LAB_SCREENSHOT=$(CURDIR)/docs/lesson.png $(PY) -m pytest -q tests/test_browser.py -k 02_lr_schedules

# Training throughput of our GPT vs a reference implementation on this machine.
bench: $(STAMP)
	$(PY) bench/train_throughput.py

# Every lesson at the gpu profile as plain Python (no Jupyter needed): ledgers as JSON in results/<device>/.
# labtools/headless.py; results/README.md says what has been run where.
gpu-results:
	$(PYTHON) -m labtools.headless all --profile gpu --timeout 1800

clean:
	rm -rf build .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
