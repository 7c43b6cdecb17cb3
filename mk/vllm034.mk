# vLLM 0.34.0 (the CUDA build; its scheduler side, KV cache classes and allocation hook on this
# CPU host, no generation). It pins torch==2.14.0, so pip fetches the CUDA wheel (nothing here
# runs a CUDA kernel). Installed without its GPU kernel packages (VLLM34_SKIP: pinned releases
# the package index lacks, e.g. flashinfer-python==0.7.3), the rest of its requirements as pinned.
VLLM34_VENV := $(ENGINES_DIR)/vllm034
VLLM34_SKIP := flashinfer-python tilelang PyNvVideoCodec nvidia-cutlass-dsl quack-kernels \
	tokenspeed-mla humming-kernels instanttensor fastsafetensors nvtx nvidia-cudnn-frontend \
	torchcodec torchaudio
VLLM34_SDIST_SHA := fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113
VLLM34_SRC       := $(ENGINES_DIR)/src/vllm-0.34.0

$(VLLM34_VENV)/.ready: mk/vllm034.mk mk/engine_deps.py
	$(ENGINE_PYTHON) -m venv $(VLLM34_VENV)
	$(VLLM34_VENV)/bin/pip install -q --no-deps vllm==0.34.0
	$(VLLM34_VENV)/bin/python mk/engine_deps.py vllm $(VLLM34_SKIP) > $(VLLM34_VENV)/deps.txt
	$(VLLM34_VENV)/bin/pip install -q -r $(VLLM34_VENV)/deps.txt $(WB_TEST_DEPS)
	$(VLLM34_VENV)/bin/pip install -q --no-deps -e .
	$(VLLM34_VENV)/bin/python -m workbench.adapters.pth install
	touch $@

$(VLLM34_SRC)/.ready: $(VLLM34_VENV)/.ready
	$(call vllm_sdist,$(VLLM34_VENV),0.34.0,$(VLLM34_SDIST_SHA))

.PHONY: engine-vllm034 test-engine-vllm034
engine-vllm034: $(VLLM34_VENV)/.ready $(VLLM34_SRC)/.ready

# The 0.34 plan on 0.34's real classes (tests/engines_real/vllm034: the allocation hook on the
# host device, two engines under one budget (in one process and in two) and without it, vLLM's own
# prefix-caching tests),
# then doctor --check. Not part of `make test-engines` (a 7 GB venv of its own).
test-engine-vllm034:
	@mkdir -p $(ENGINES_DIR) && rm -f $(VLLM34_VENV).failed
	$(call step,$(VLLM34_VENV).failed,vllm 0.34: venv and test sources,$(MAKE) --no-print-directory engine-vllm034)
	$(call step,$(VLLM34_VENV).failed,vllm 0.34: real-engine tests,$(VLLM_PYTEST) $(VLLM34_VENV)/bin/python -m pytest -m engine tests/engines_real/vllm034 $(PYTEST_ARGS))
	$(call step,$(VLLM34_VENV).failed,vllm 0.34: doctor --check,WORKBENCH_KV_AUTOPATCH=1 VLLM_TARGET_DEVICE=cpu $(VLLM34_VENV)/bin/workbench doctor --check)
	$(call verdict,$(VLLM34_VENV).failed,vllm 0.34)
