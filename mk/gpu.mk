# An ordinary NVIDIA GPU host (network, a driver; not the lent GPU machine, whose recipe is
# gpu/vllm26): `make gpu-venv` builds an engine venv with the full vLLM 0.26.0 wheel (its
# compiled ops, FlashAttention 2 and 3) and the CUDA torch that wheel pins (2.11.0), plus the
# workbench (editable) and its autopatch .pth; `make gpu-labs` and `make gpu-bench` run on it.
# Every target refuses in one line where no NVIDIA GPU is visible (nvidia-smi lists none).
# pip resolves torch from its configured index: for another CUDA build of torch 2.11.0, point
# pip at it the usual way (PIP_EXTRA_INDEX_URL) before `make gpu-venv`.
GPU_VENV     ?= .venvs/vllm26-gpu
GPU_PYTHON   ?= python3
GPU_VLLM     ?= vllm==0.26.0
GPU_LABS     ?= output-equality dynamic-limit grow-reclaim
GPU_OUT      ?= results/gpu
GPU_RUNNER   ?= 0
GPU_BENCH_ARGS ?=
GPU_PY       := $(GPU_VENV)/bin/python
GPU_STAMP    := $(GPU_VENV)/.ready

# $(call gpu_check,TARGET): the one-line refusal without a GPU
gpu_check = @n=$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU '); [ "$$n" -gt 0 ] || { \
	echo "make $(1): no NVIDIA GPU visible here (nvidia-smi lists none); vLLM's CUDA build needs one: run it on a GPU host"; \
	exit 2; }

.PHONY: gpu-venv gpu-labs gpu-bench clean-gpu

$(GPU_STAMP): mk/gpu.mk pyproject.toml
	$(GPU_PYTHON) -m venv $(GPU_VENV)
	$(GPU_PY) -m pip install -q --upgrade pip
	$(GPU_PY) -m pip install -q "$(GPU_VLLM)"
	$(GPU_PY) -m pip install -q -e '.[viz,gpu]' "pytest>=8.4" "hypothesis>=6.100"
	$(GPU_PY) -m workbench.adapters.pth install
	$(GPU_PY) -c "from workbench.engines.real.vllm_build import build; b = build(); \
	  print('vLLM build:', b); raise SystemExit(0 if b == 'compiled ops' else 1)"
	touch $@

gpu-venv:
	$(call gpu_check,gpu-venv)
	@$(MAKE) --no-print-directory $(GPU_STAMP) vmmfast

# the labs on a real vLLM with its own kernels; GPU_RUNNER=1 asks for vLLM's Model Runner V2
gpu-labs:
	$(call gpu_check,gpu-labs)
	@$(MAKE) --no-print-directory $(GPU_STAMP) vmmfast
	@mkdir -p $(GPU_OUT); rc=0; for lab in $(GPU_LABS); do \
	  VLLM_USE_V2_MODEL_RUNNER=$(GPU_RUNNER) WORKBENCH_VLLM_PYTHON=$(abspath $(GPU_PY)) \
	  $(GPU_PY) -m workbench labs run $$lab --backend gpu --param engine=vllm \
	    --out $(GPU_OUT)/$$lab.json || rc=1; done; exit $$rc

# stock vs elastic prefill and TPOT of the 8B shape against its weights-read floor
gpu-bench:
	$(call gpu_check,gpu-bench)
	@$(MAKE) --no-print-directory $(GPU_STAMP) vmmfast
	VLLM_USE_V2_MODEL_RUNNER=$(GPU_RUNNER) $(GPU_PY) -m workbench.bench.vllm_speed \
	  --out $(GPU_OUT)/speed $(GPU_BENCH_ARGS)

clean-gpu:
	rm -rf $(GPU_VENV)
