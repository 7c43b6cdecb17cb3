#!/usr/bin/env bash
# Sourced by serve.sh on the GPU machine: SGLang 0.5.16's environment there and (once per
# machine) what prepare.sh built installed into /tmp/ssite, with the autopatch .pth file.
# Needs DEST (prepare.sh's folder) and CODE (the project checkout) set by the caller.
SITE=/tmp/ssite
T0=$(date +%s)
say() { echo "[sglang0516 +$(( $(date +%s) - T0 ))s] $*"; }
PY=python3
if ! python3 -c "import torch" >/dev/null 2>&1 && [ -x /opt/torch/.venv/bin/python3 ]; then
  PY=/opt/torch/.venv/bin/python3
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SGLANG_IS_FLASHINFER_AVAILABLE=false SGLANG_ENABLE_JIT_DEEPGEMM=0
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=/tmp/hf_home DO_NOT_TRACK=1
export TRITON_CACHE_DIR=/tmp/triton_cache TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo
if [ ! -d "$SITE/sglang" ]; then
  mkdir -p "$SITE/xgrammar"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$DEST"/wheels/*.whl || say "pip install FAILED"
  for t in sglang transformers sgl_kernel flashinfer; do
    tar -xJf "$DEST/$t.tar.xz" -C "$SITE" || say "$t FAILED to unpack"
  done
  cp "$CODE/gpu/sglang0516/xgrammar_stub.py" "$SITE/xgrammar/__init__.py"
fi
# flashinfer's norm kernels are JIT-built from CUDA sources that do not travel: sgl_kernel then
# takes its own rmsnorm from common_ops, as it does wherever flashinfer is absent
sed -i 's/^    import flashinfer.norm as _flashinfer_norm$/    raise ImportError("flashinfer norm sources do not travel")/' \
  "$SITE/sgl_kernel/elementwise.py"
say "installed ($(du -sh "$SITE" | cut -f1))"
export PYTHONPATH="$SITE:$CODE"
# an interpreter that sees this engine's packages whatever PYTHONPATH its caller has: a lab
# that starts a vLLM and an SGLang side by side gives each engine kind its own
printf '#!/bin/sh\nPYTHONPATH="%s:%s" exec "%s" "$@"\n' "$SITE" "$CODE" "$(command -v "$PY")" \
  > "$SITE/python" && chmod +x "$SITE/python"
export WORKBENCH_SGLANG_PYTHON="$SITE/python"
"$PY" -m workbench.adapters.pth install && say "autopatch .pth installed"
if ! /sbin/ldconfig -p 2>/dev/null | grep -q libcuda.so.1; then
  lib=$("$PY" -c "import torch; torch.zeros(1, device='cuda')
print(next((l.split()[-1] for l in open('/proc/self/maps') if 'libcuda.so' in l), ''))")
  [ -n "$lib" ] && export TRITON_LIBCUDA_PATH="$(dirname "$lib")" && say "libcuda at $lib"
fi
