#!/usr/bin/env bash
# On the GPU machine, from the checkout root, in a call of its own: unpack vLLM's compiled op
# library (prepare.sh's OPS folder) into /tmp, where env.sh finds it on the next call while the
# machine stays warm (about 30 s).   bash gpu/vllm26/ops.sh OPS
set -euo pipefail
OPS="${1:?usage: ops.sh OPS}"
mkdir -p /tmp/vllm26ops
xz -dc "$OPS/_C_stable_libtorch.abi3.so.xz" > /tmp/vllm26ops/_C_stable_libtorch.abi3.so.part
mv /tmp/vllm26ops/_C_stable_libtorch.abi3.so.part /tmp/vllm26ops/_C_stable_libtorch.abi3.so
ls -la /tmp/vllm26ops
