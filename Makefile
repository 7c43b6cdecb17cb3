# Two commands on a fresh machine: `make lab` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ready
PYTEST_ARGS ?=
LAB_ARGS ?=

.PHONY: lab test test-browser test-gpu setup browser-deps lint clean vmmfast torch

# --system-site-packages: on a GPU host the venv sees the host's CUDA torch and cuda-python.
$(STAMP): pyproject.toml
	@echo "setup: creating $(VENV) and installing the workbench with [dev] (a few minutes the first time)"
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m ipykernel install --sys-prefix --name workbench --display-name "Python (workbench)" >/dev/null
	@$(MAKE) --no-print-directory vmmfast
	touch $(STAMP)

setup: $(STAMP) vmmfast

# The C fast path to the driver (workbench/gpu/vmmfast.c) and the C stand-in driver its CPU
# tests and the overhead bench use. No CUDA toolkit needed (the driver is opened at run time);
# without a C compiler this says so in one line and the Python path is used.
FAST_LIBS := workbench/gpu/_vmmfast.so workbench/gpu/_fakecuda.so
vmmfast:
	@if command -v $(CC) >/dev/null 2>&1; then $(MAKE) --no-print-directory $(FAST_LIBS); \
	else echo "vmmfast: no C compiler ($(CC)): skipped, the Python batch is used"; fi

workbench/gpu/_%.so: workbench/gpu/%.c
	$(CC) -O2 -Wall -Wextra -shared -fPIC -o $@ $< -ldl

# `make torch`: torch for the mini engine (`serve`, `bench crossover`, the mini labs) and the host
# device's tensor views. CPU torch for the tests of the mini engine and the host device's tensor views. 2.13.0 is the
# CPU build that lies on this project's machines; elsewhere set TORCH_SPEC to what suits you.
TORCH_SPEC ?= torch==2.13.0
TORCH_STAMP := $(VENV)/.torch
$(TORCH_STAMP): $(STAMP)
	$(PY) -c "import torch" 2>/dev/null || { echo "torch: installing $(TORCH_SPEC) into $(VENV) (a large download, minutes)"; \
	  $(PY) -m pip install -q "$(TORCH_SPEC)"; }
	touch $(TORCH_STAMP)

torch: $(TORCH_STAMP)

# Debian's chromium for the real-browser test (Playwright drives it; it downloads no browser).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then echo "browser-deps: installing Debian's chromium with apt (a minute or two)"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing: the browser test will be skipped (sudo apt-get install chromium)"; fi; }

# JupyterLab rooted here, opening chapters/00_start_here.ipynb (the URL it prints goes there).
lab: $(STAMP)
	$(VENV)/bin/workbench lab $(LAB_ARGS)

# Plugin autoload off: only the plugins pyproject's addopts names (-p timeout, -p hypothesispytest)
# load, not whatever a GPU host's system site-packages holds.
test: $(STAMP) $(TORCH_STAMP) browser-deps
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(PY) -m pytest -m "not gpu and not engine and not every_notebook" $(PYTEST_ARGS)

# Every chapter and lab notebook opened in Chromium (make test opens the first ones a learner does).
test-browser: $(STAMP) $(TORCH_STAMP) browser-deps
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(PY) -m pytest -m browser $(PYTEST_ARGS)

# Uses the venv when there is one, else the host's python (a bare GPU box without network).
test-gpu: vmmfast
	@py=$(PY); [ -x "$$py" ] || py=$(PYTHON); \
	$$py -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
	  'make test-gpu: no CUDA GPU is visible to this python')" && \
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $$py -m pytest -m gpu $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check workbench tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis artifacts $(FAST_LIBS)

# Optional targets kept in their own files (engine environments, GPU runs).
-include mk/*.mk
