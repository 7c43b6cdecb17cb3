#!/usr/bin/env bash
# On the GPU machine, from the checkout root: the labs on a real vLLM 0.26 (engine=vllm).
#   bash gpu/vllm26/labs.sh DEST CODE OUT LAB...     (LAB: output-equality, dynamic-limit, ...)
set -u -o pipefail
DEST="$(cd "${1:?usage: labs.sh DEST CODE OUT LAB...}" && pwd)"
CODE="$(cd "${2:?usage: labs.sh DEST CODE OUT LAB...}" && pwd)"
OUT="${3:?usage: labs.sh DEST CODE OUT LAB...}"
shift 3
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
cd "$CODE"
"$PY" -m workbench.labs.vllm_runs "$@" --backend gpu --out "$OUT"
rc=$?
say "labs exit $rc"
exit $rc
