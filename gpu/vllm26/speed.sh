#!/usr/bin/env bash
# On the GPU machine, from the checkout root: vLLM 0.26 stock vs elastic speed (prefill against
# prompt length, TPOT against the weights-read floor; workbench.bench.vllm_speed), then the
# limit bench (elastic under a kvctl limit ÷ stock given the same bytes) in what is left of
# TOTAL_S (default 570 s) if that is at least 150 s.
#   bash gpu/vllm26/speed.sh DEST CODE OUT [vllm_speed args]
# Run gpu/vllm26/ops.sh in the call before (same warm machine) for vLLM's own op library.
set -u -o pipefail
DEST="$(cd "${1:?usage: speed.sh DEST CODE OUT}" && pwd)"
CODE="$(cd "${2:?usage: speed.sh DEST CODE OUT}" && pwd)"
OUT="${3:?usage: speed.sh DEST CODE OUT}"
shift 3
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv,noheader
cd "$CODE"
mkdir -p "$OUT/speed" "$OUT/limit"
timeout "${SPEED_TIMEOUT_S:-360}" "$PY" -m workbench.bench.vllm_speed --out "$OUT/speed" "$@"
say "speed exit $?"
left=$(( ${TOTAL_S:-570} - ($(date +%s) - T0) - 15 ))
if [ "$left" -ge 150 ]; then
  say "limit bench, $left s left"
  "$PY" -m workbench.engines.real.tinymodel /tmp/tiny-llama >/dev/null
  timeout "$left" "$PY" -m workbench.bench.vllm_limit --model /tmp/tiny-llama \
    --device cuda --graphs --blocks 512 --prompts 64 --prompt-len 32 --tokens 200 \
    --block-size 16 --repeats "${LIMIT_REPEATS:-3}" --out "$OUT/limit"
  say "limit exit $?"
fi
