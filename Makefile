# Two entry points (README): `make run` executes the quickstart notebook headless on the built-in
# demo model; `make test` runs the test suite. Both create .venv and install lmnb on first use.
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch; on a GPU box use e.g. `make run TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
NOTEBOOK ?= notebooks/01-quickstart.ipynb

.PHONY: install run test bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	$(VENV)/bin/lmnb install-kernel --sys-prefix
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/lmnb run $(NOTEBOOK) -o $(basename $(NOTEBOOK)).out.ipynb

# The real-browser widget test needs Debian chromium and playwright-core (tests/browser/setup.sh;
# idempotent, uses apt-get and npm, so it needs root the first time).
# Two pytest workers (pytest-xdist), each taking whole test files, so a file's module fixtures
# (an engine, a kernel) load once: on CI's two cores the suite's waits on subprocesses, kernels and
# timeouts overlap with the other worker's computing. Files are handed out in collection order
# (--no-loadscope-reorder; xdist would start with the files of most tests), which
# tests/conftest.py starts with the longest-running ones. A worker that crashes (a segfault) ends the
# run, failed, at once (--max-worker-restart 0): with --dist loadfile, xdist's replacing it can hang
# the run for good (pytest-dev/pytest-xdist#784, #1378), and CI then timed out with no report.
test: install
	bash tests/browser/setup.sh $(VENV)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart 0 tests
