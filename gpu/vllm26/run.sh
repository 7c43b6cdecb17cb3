#!/usr/bin/env bash
# On the GPU machine, from the checkout root: install what prepare.sh built, arm autopatch
# (the .pth file, as on any host), then run the vLLM GPU tests.
#   bash gpu/vllm26/run.sh DEST CODE [pytest args]
# DEST: prepare.sh's folder; CODE: the project checkout to test (its root).
set -u -o pipefail
DEST="$(cd "${1:?usage: run.sh DEST CODE}" && pwd)"
CODE="$(cd "${2:?usage: run.sh DEST CODE}" && pwd)"
shift 2
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
cd "$CODE"
"$PY" -m pytest -p no:cacheprovider -o addopts= -q -rA tests/gpu/test_vllm_gpu.py "$@"
rc=$?
say "pytest exit $rc"
exit $rc
