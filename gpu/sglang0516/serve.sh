#!/usr/bin/env bash
# On the GPU machine, from the checkout root: SGLang 0.5.16's server stock, then with autopatch,
# the same prompts through both; figures and logs under OUT.
#   bash gpu/sglang0516/serve.sh DEST CODE OUT [serve.py args]    (SERVE_TIMEOUT_S: its limit)
set -u -o pipefail
DEST="$(cd "${1:?usage: serve.sh DEST CODE OUT}" && pwd)"
CODE="$(cd "${2:?usage: serve.sh DEST CODE OUT}" && pwd)"
OUT="${3:?usage: serve.sh DEST CODE OUT}"
shift 3
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
mkdir -p "$OUT"
cd "$CODE"
timeout "${SERVE_TIMEOUT_S:-1200}" "$PY" gpu/sglang0516/serve.py --out "$OUT" "$@"
rc=$?
say "serve.py exit $rc"
exit $rc
