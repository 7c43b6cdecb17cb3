#!/usr/bin/env bash
# On the GPU machine, from the checkout root: the labs on a real SGLang 0.5.16 (engine=sglang),
# each at its quick size. Installs the carry into /tmp/ssite first (once per machine).
#   bash gpu/sglang0516/labs.sh DEST CODE OUT LAB...   (LAB: output-equality, dynamic-limit,
#   grow-reclaim, same-engine-pair)
set -u -o pipefail
DEST="$(cd "${1:?usage: labs.sh DEST CODE OUT LAB...}" && pwd)"
CODE="$(cd "${2:?usage: labs.sh DEST CODE OUT LAB...}" && pwd)"
OUT="${3:?usage: labs.sh DEST CODE OUT LAB...}"
shift 3
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
mkdir -p "$OUT"
cd "$CODE"
rc=0
for lab in "$@"; do  # each lab's record OUT/LAB.json and report OUT/LAB.md; one failing, the next runs
  say "lab $lab"
  WORKBENCH_VLLM_LOGS="$OUT/logs" "$PY" -m workbench labs run "$lab" --backend gpu \
    --param engine=sglang --quick --out "$OUT/$lab.json" || rc=1
done
say "labs exit $rc"
exit $rc
