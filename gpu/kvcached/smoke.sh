#!/usr/bin/env bash
# On the GPU machine, from the checkout root: one PEAK of kvcached's trace on three 8B-shaped
# vLLM 0.26 engines, static, workbench elastic and kvcached 0.1.6 in turn (smoke.py).
#   bash gpu/kvcached/smoke.sh VLLM_DEST KVC_DEST OUT [--peak N] [--modes a,b,c]
set -u -o pipefail
DEST="$(cd "${1:?usage: smoke.sh VLLM_DEST KVC_DEST OUT [smoke.py args]}" && pwd)"
KVC="$(cd "${2:?usage: smoke.sh VLLM_DEST KVC_DEST OUT [smoke.py args]}" && pwd)"
OUT="${3:?usage: smoke.sh VLLM_DEST KVC_DEST OUT [smoke.py args]}"
shift 3
CODE="$(pwd)"
source "$(dirname "${BASH_SOURCE[0]}")/../vllm26/env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
"$PY" "$CODE/gpu/kvcached/smoke.py" "$OUT" "$@"
rc=$?
say "smoke exit $rc"
exit $rc
