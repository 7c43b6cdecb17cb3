# Two commands on a fresh machine: `make lab` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ready
PYTEST_ARGS ?=

.PHONY: lab test test-gpu test-engines setup browser-deps lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m ipykernel install --sys-prefix --name workbench --display-name "Python (workbench)" >/dev/null
	touch $(STAMP)

setup: $(STAMP)

# Debian's chromium for the real-browser test (Playwright drives it; it downloads no browser).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing: the browser test will be skipped (sudo apt-get install chromium)"; fi; }

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=chapters chapters/00_start_here.ipynb

test: $(STAMP) browser-deps
	$(PY) -m pytest -m "not gpu and not engine" $(PYTEST_ARGS)

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check workbench tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis artifacts

# Optional targets kept in their own files (engine environments, GPU runs).
-include mk/*.mk
