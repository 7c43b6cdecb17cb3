#!/usr/bin/env bash
# Sourced by run.sh, labs.sh and speed.sh on the GPU machine: the environment vLLM 0.26 runs
# under, and (once per machine) what prepare.sh built installed into /tmp/vsite with the
# autopatch .pth. Needs DEST (prepare.sh's folder) and CODE (the project checkout) set by the
# caller. vLLM's own op library is used where ops.sh left it in /tmp and it loads; else
# opstub.py stands in, and WORKBENCH_VLLM_BUILD (which the records copy) says which.
SITE=/tmp/vsite
T0=$(date +%s)
say() { echo "[run.sh +$(( $(date +%s) - T0 ))s] $*"; }
PY=python3
if ! python3 -c "import torch" >/dev/null 2>&1 && [ -x /opt/torch/.venv/bin/python3 ]; then
  PY=/opt/torch/.venv/bin/python3
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_V2_MODEL_RUNNER="${VLLM_USE_V2_MODEL_RUNNER:-0}"
export VLLM_USE_FLASHINFER_SAMPLER=0
export VLLM_USE_DEEP_GEMM=0 VLLM_HOST_IP=127.0.0.1 GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_CACHE_ROOT=/tmp/vllm_cache VLLM_CONFIG_ROOT=/tmp/vllm_config HF_HOME=/tmp/hf_home
export TRITON_CACHE_DIR=/tmp/triton_cache TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
if [ ! -d "$SITE/vllm" ]; then
  mkdir -p "$SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$DEST"/wheels/*.whl || say "pip install FAILED"
  tar -xJf "$DEST/vllm_py.tar.xz" -C "$SITE" || say "vLLM sources FAILED to unpack"
  tar -xJf "$DEST/fa3.tar.xz" -C "$SITE" || say "FlashAttention 3 FAILED to unpack"
fi
OPLIB=/tmp/vllm26ops/_C_stable_libtorch.abi3.so
stand_in() {  # the import-only stand-in: Triton attention, native ops (opstub.py says why)
  rm -f "$SITE/vllm/_C_stable_libtorch.abi3.so"
  cp "$CODE/gpu/vllm26/opstub.py" "$SITE/"
  printf 'import opstub\nopstub.install(__name__)\n' > "$SITE/vllm/_C_stable_libtorch.py"
  export WORKBENCH_VLLM_BUILD="stand-in (opstub.py: $1)"
}
if [ -f "$OPLIB" ]; then
  cp "$OPLIB" "$SITE/vllm/" && rm -f "$SITE/vllm/_C_stable_libtorch.py" "$SITE/opstub.py"
  if err=$(PYTHONPATH="$SITE" "$PY" -c "import torch, vllm._C_stable_libtorch as m
assert m.__file__.endswith('.so'), m.__file__" 2>&1); then
    export WORKBENCH_VLLM_BUILD="compiled ops"
  else
    stand_in "the op library did not load: $(echo "$err" | tail -1 | cut -c1-160)"
  fi
else
  stand_in "no op library in /tmp/vllm26ops (ops.sh not run on this machine)"
fi
say "installed ($(du -sh "$SITE" | cut -f1)); vLLM build: $WORKBENCH_VLLM_BUILD"
export PYTHONPATH="$SITE:$CODE"
# an interpreter that sees this engine's packages whatever PYTHONPATH its caller has: a lab
# that starts a vLLM and an SGLang side by side gives each engine kind its own
printf '#!/bin/sh\nPYTHONPATH="%s:%s" exec "%s" "$@"\n' "$SITE" "$CODE" "$(command -v "$PY")" \
  > "$SITE/python" && chmod +x "$SITE/python"
export WORKBENCH_VLLM_PYTHON="$SITE/python"
"$PY" -m workbench.adapters.pth install && say "autopatch .pth installed"
if ! /sbin/ldconfig -p 2>/dev/null | grep -q libcuda.so.1; then
  lib=$("$PY" -c "import torch; torch.zeros(1, device='cuda')
import re; print(next((l.split()[-1] for l in open('/proc/self/maps') if 'libcuda.so' in l), ''))")
  [ -n "$lib" ] && export TRITON_LIBCUDA_PATH="$(dirname "$lib")" && say "libcuda at $lib"
fi
