#!/usr/bin/env bash
# On the GPU machine, from the checkout root: build kvcached 0.1.6 (env.sh, once per machine,
# timed) over vLLM 0.26 (gpu/vllm26/env.sh), then import vLLM's patched modules under kvcached's
# switches without starting an engine: its log says which patches applied to vLLM 0.26.
#   bash gpu/kvcached/build.sh VLLM_DEST KVC_DEST     (prepare.sh's folders)
set -u -o pipefail
DEST="$(cd "${1:?usage: build.sh VLLM_DEST KVC_DEST}" && pwd)"
KVC="$(cd "${2:?usage: build.sh VLLM_DEST KVC_DEST}" && pwd)"
CODE="$(pwd)"
source "$(dirname "${BASH_SOURCE[0]}")/../vllm26/env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
[ -n "${WORKBENCH_KVCACHED_PYTHON:-}" ] || exit 1
ENABLE_KVCACHED=true KVCACHED_IPC_NAME=kvc_build_check VLLM_USE_V2_MODEL_RUNNER=0 \
  "$WORKBENCH_KVCACHED_PYTHON" -c "
import vllm, vllm.v1.engine.core, vllm.v1.worker.gpu_worker, vllm.v1.worker.gpu_model_runner
import vllm.v1.core.kv_cache_coordinator, vllm.v1.core.block_pool, vllm.v1.core.kv_cache_manager
import kvcached
print('vllm', vllm.__version__, 'kvcached', kvcached.__version__)" 2>&1 | grep -E "patch|vllm |Error|error" | cut -c1-400
"$WORKBENCH_KVCACHED_PYTHON" -m kvcached.cli.kvctl list --json 2>&1 | tail -2
say "build check done"
