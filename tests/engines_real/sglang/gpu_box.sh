#!/usr/bin/env bash
# Run the SGLang GPU tests on a bare GPU box from wheels carried there (gpu_wheels.sh made them):
# install them into a private folder (nothing of the box's own Python changes), then pytest.
# usage (from the repository root): bash tests/engines_real/sglang/gpu_box.sh WHEEL_DIR [pytest args]
set -u
WHL=${1:?usage: gpu_box.sh WHEEL_DIR [pytest args]}
shift
SITE=${SGL_SITE:-/tmp/sglang-site}
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$WHL"/*.whl || exit 1
echo "installed in $(( $(date +%s) - t0 )) s"
# NVLink multicast stays off on shared GPU hosts
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader || true
python3 -m pytest -p no:cacheprovider -m gpu tests/gpu/test_sglang_gpu.py "$@"
