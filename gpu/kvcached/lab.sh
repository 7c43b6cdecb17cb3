#!/usr/bin/env bash
# On the GPU machine, from the checkout root: the colocation lab at kvcached's own setting, static,
# workbench elastic and kvcached 0.1.6 side by side per PEAK (one mode's engines at a time).
#   bash gpu/kvcached/lab.sh VLLM_DEST KVC_DEST OUT [--peaks 16] [--param repeats=3 ...]
# OUT/colocation-kvcached.json and .md (the record and report), OUT/repeats/repeat_<r>.json (the
# raw repeats, rewritten after every point), OUT/logs (every engine's log).
set -u -o pipefail
DEST="$(cd "${1:?usage: lab.sh VLLM_DEST KVC_DEST OUT [lab args]}" && pwd)"
KVC="$(cd "${2:?usage: lab.sh VLLM_DEST KVC_DEST OUT [lab args]}" && pwd)"
OUT="${3:?usage: lab.sh VLLM_DEST KVC_DEST OUT [lab args]}"
shift 3
CODE="$(pwd)"
source "$(dirname "${BASH_SOURCE[0]}")/../vllm26/env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
mkdir -p "$OUT"
cd "$CODE"
WORKBENCH_VLLM_LOGS="$OUT/logs" "$PY" -m workbench labs run colocation --backend gpu \
  --param engine=vllm --param setting=kvcached --param out_dir="$OUT/repeats" \
  --out "$OUT/colocation-kvcached.json" "$@"
rc=$?
say "lab exit $rc"
exit $rc
