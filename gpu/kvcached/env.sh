#!/usr/bin/env bash
# Sourced on the GPU machine after gpu/vllm26/env.sh (which sets PY, SITE, CODE and say): builds
# kvcached 0.1.6 from the sdist prepare.sh brought (KVC: that folder) against the image's torch
# and CUDA toolchain into /tmp/kvsite, once per machine, and names an interpreter that sees it.
#   KVC=DEST source gpu/kvcached/env.sh
# Only that interpreter (WORKBENCH_KVCACHED_PYTHON: /tmp/kvsite, then vLLM 0.26's site, then the
# checkout) finds kvcached. Its .pth goes into the image's site-packages, where it does nothing in a
# process that cannot import kvcached; in one that can, ENABLE_KVCACHED=true makes it patch vLLM
# as vLLM is imported (workbench.engines.real.kvcached sets the switches per engine).
KSITE=/tmp/kvsite
: "${KVC:?set KVC to the folder prepare.sh built}" "${SITE:?source gpu/vllm26/env.sh first}"
if ! PYTHONPATH="$KSITE" "$PY" -c "import kvcached.vmm_ops" >/dev/null 2>&1; then
  rm -rf "$KSITE" /tmp/kvbuild /tmp/kvtools && mkdir -p "$KSITE" /tmp/kvbuild
  tar -xzf "$KVC/kvcached-0.1.6.tar.gz" -C /tmp/kvbuild
  # a setuptools that reads kvcached's pyproject, for the build alone
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/kvtools "$KVC"/build/setuptools-*.whl
  # -lcuda at link time: the driver's library may lack its unversioned name; the toolkit's stub
  # has it (the engine loads the driver's own libcuda.so.1 at run time)
  NVCC=$(command -v nvcc || true)
  CUDA_ROOT=${CUDA_HOME:-${NVCC:+$(dirname "$(dirname "$NVCC")")}}
  for d in "$CUDA_ROOT/lib64/stubs" "$CUDA_ROOT/targets/x86_64-linux/lib/stubs"; do
    [ -f "$d/libcuda.so" ] && export LIBRARY_PATH="$d${LIBRARY_PATH:+:$LIBRARY_PATH}"
  done
  t=$(date +%s)
  if PYTHONPATH="/tmp/kvtools:$SITE" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
      MAX_JOBS="${MAX_JOBS:-16}" "$PY" -m pip install -q --no-build-isolation --no-index \
      --no-deps --no-cache-dir --target "$KSITE" /tmp/kvbuild/kvcached-0.1.6 "$KVC"/wheels/*.whl \
      > /tmp/kvbuild/build.log 2>&1; then
    say "kvcached 0.1.6 built in $(( $(date +%s) - t )) s (nvcc: ${NVCC:-none}, CUDA: ${CUDA_ROOT:-?})"
  else
    say "kvcached 0.1.6 build FAILED after $(( $(date +%s) - t )) s:"
    grep -iE "error|fatal" /tmp/kvbuild/build.log | head -20
    tail -20 /tmp/kvbuild/build.log
  fi
fi
PTH=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/kvcached_autopatch.pth
for src in "$KSITE/kvcached_autopatch.pth" /tmp/kvbuild/kvcached-0.1.6/kvcached_autopatch.pth; do
  [ -f "$src" ] && cp "$src" "$PTH" && break
done
printf '#!/bin/sh\nPYTHONPATH="%s:%s:%s" exec "%s" "$@"\n' "$KSITE" "$SITE" "$CODE" \
  "$(command -v "$PY")" > "$KSITE/python" && chmod +x "$KSITE/python"
if out=$("$KSITE/python" -c "import kvcached, kvcached.vmm_ops, wrapt, posix_ipc
print(kvcached.__version__, wrapt.__version__)" 2>&1); then
  export WORKBENCH_KVCACHED_PYTHON="$KSITE/python"
  say "kvcached $(echo "$out" | tail -1 | cut -d' ' -f1) importable (wrapt $(echo "$out" | tail -1 | cut -d' ' -f2)); .pth at $PTH; WORKBENCH_KVCACHED_PYTHON=$WORKBENCH_KVCACHED_PYTHON"
else
  unset WORKBENCH_KVCACHED_PYTHON
  say "kvcached NOT importable: $(echo "$out" | tail -3 | tr '\n' ' ' | cut -c1-400)"
fi
