"""vLLM's own ``vllm.v1.worker.utils.allocate_kv_cache`` on a CPU device, called the way the model
runner calls it (one full-attention group, layer-compact ``LBHNC``): stock it is one
``torch.zeros``; with ``WORKBENCH_KV_AUTOPATCH=1`` the views lie over a workbench KV range on the
host device. Works without a model or attention kernels, so it also runs on the CUDA build of
vLLM 0.33 on a CPU-only host. Prints one ``RESULT {json}`` line."""

from __future__ import annotations

import json

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker import utils

BLOCK, HEADS, HEAD, LAYERS, NUM_BLOCKS = 32, 2, 32, 2, 512


def main() -> None:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                             dtype=torch.bfloat16)
    page = spec.page_size_bytes
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    tensor = KVCacheTensor(size=page * NUM_BLOCKS * LAYERS, layers=names,
                           layer_stride=page * NUM_BLOCKS, block_stride=page)
    cfg = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[tensor],
                        kv_cache_groups=[KVCacheGroupSpec(names, spec)])
    views = utils.allocate_kv_cache(cfg, torch.device("cpu"), KVCacheLayout.LBHNC)
    out = {"patched": bool(getattr(utils.allocate_kv_cache, "__workbench_patched__", False)),
           "page_bytes": page,
           "views": {n: {"shape": list(v.shape), "stride": list(v.stride()),
                         "dtype": str(v.dtype)} for n, v in views.items()}}
    kv = None
    if out["patched"]:
        from workbench.adapters.vllm import registry

        kv = registry.ledger_for(NUM_BLOCKS)
        out["mapped_before"] = kv.pages.mapped_pages
        kv.hold([7, NUM_BLOCKS - 1])  # what the block pool does before vLLM writes
        out["mapped_held"] = kv.pages.mapped_pages
    # write through vLLM's views, read back: distinct per layer and block
    for li, v in enumerate(views.values()):
        for b in (7, NUM_BLOCKS - 1):
            v[b].fill_(li * 1000 + b)
    out["readback"] = all(bool((v[b] == li * 1000 + b).all())
                          for li, v in enumerate(views.values()) for b in (7, NUM_BLOCKS - 1))
    if kv is not None:
        out["rss_shmem_kib"] = _rss_shmem()
        kv.release([7, NUM_BLOCKS - 1])
        kv.check_invariants()
        out["mapped_released"] = kv.pages.mapped_pages
        out["maps"], out["unmaps"] = kv.count_events("map"), kv.count_events("unmap")
    print("RESULT " + json.dumps(out))


def _rss_shmem() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1])
    return -1


if __name__ == "__main__":
    main()
