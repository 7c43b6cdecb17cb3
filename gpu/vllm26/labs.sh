#!/usr/bin/env bash
# On the GPU machine, from the checkout root: the labs on a real vLLM 0.26 (engine=vllm).
#   bash gpu/vllm26/labs.sh DEST CODE OUT LAB...     (LAB: output-equality, dynamic-limit, ...)
# RUNNER=v1|v2 in the environment passes the labs runner= (vLLM's model runner V1 or V2).
set -u -o pipefail
DEST="$(cd "${1:?usage: labs.sh DEST CODE OUT LAB...}" && pwd)"
CODE="$(cd "${2:?usage: labs.sh DEST CODE OUT LAB...}" && pwd)"
OUT="${3:?usage: labs.sh DEST CODE OUT LAB...}"
shift 3
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
cd "$CODE"
rc=0
for lab in "$@"; do  # each lab's record OUT/LAB.json and report OUT/LAB.md; one failing, the next runs
  WORKBENCH_VLLM_LOGS="$OUT/logs" "$PY" -m workbench labs run "$lab" --backend gpu \
    --param engine=vllm ${RUNNER:+--param runner=$RUNNER} --out "$OUT/$lab.json" || rc=1
done
say "labs exit $rc"
exit $rc
