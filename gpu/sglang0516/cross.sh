#!/usr/bin/env bash
# On the GPU machine, from the checkout root: cross-engine with a real vLLM 0.26 and a real
# SGLang 0.5.16 side by side (engine=real), each engine kind with its own interpreter.
#   bash gpu/sglang0516/cross.sh SGLANG_DEST VLLM_DEST CODE OUT [--full]
# SGLANG_DEST may be absent when /tmp/ssite is already installed (an earlier call on the same
# warm machine ran labs.sh): one call's carry holds one engine's folder, not both.
set -u -o pipefail
SDEST="${1:?usage: cross.sh SGLANG_DEST VLLM_DEST CODE OUT}"
VDEST="$(cd "${2:?usage: cross.sh SGLANG_DEST VLLM_DEST CODE OUT}" && pwd)"
CODE="$(cd "${3:?usage: cross.sh SGLANG_DEST VLLM_DEST CODE OUT}" && pwd)"
OUT="${4:?usage: cross.sh SGLANG_DEST VLLM_DEST CODE OUT}"
SIZE=--quick
[ "${5:-}" = "--full" ] && SIZE=
if [ ! -d /tmp/ssite/sglang ] && [ ! -d "$SDEST" ]; then
  echo "cross.sh: no /tmp/ssite and no $SDEST: run labs.sh with the SGLang carry first" >&2
  exit 3
fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="$SDEST"
source "$HERE/env.sh"
SGL_PY="$WORKBENCH_SGLANG_PYTHON"
DEST="$VDEST"
source "$HERE/../vllm26/env.sh"
export WORKBENCH_SGLANG_PYTHON="$SGL_PY"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
mkdir -p "$OUT"
cd "$CODE"
WORKBENCH_VLLM_LOGS="$OUT/logs" "$PY" -m workbench labs run cross-engine --backend gpu \
  --param engine=real $SIZE --out "$OUT/cross-engine.json"
rc=$?
say "cross-engine exit $rc"
exit $rc
