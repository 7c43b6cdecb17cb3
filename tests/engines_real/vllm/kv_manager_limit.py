"""vLLM's real KVCacheManager + BlockPool under a workbench memory limit: a request that does not
fit gets vLLM's ``None`` from ``allocate_slots`` (the scheduler preempts or waits), never an
exception, and fits again once blocks are freed. Prints one ``RESULT {json}`` line."""

from __future__ import annotations

import json

import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

BLOCK, NUM_BLOCKS = 16, 2048


def main() -> None:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float16)
    cfg = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    mgr = KVCacheManager(cfg, max_model_len=16384, scheduler_block_size=BLOCK,
                         hash_block_size=BLOCK, enable_caching=True)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    pool = mgr.block_pool
    out = {"pool": type(pool).__name__, "free0": pool.get_num_free_blocks()}

    def admit(rid: str, n_tokens: int, first: int):
        req = Request(rid, list(range(first, first + n_tokens)), SamplingParams(max_tokens=1), None,
                      block_hasher=hasher)
        computed, hit, _ = mgr.get_computed_blocks(req)
        return req, mgr.allocate_slots(req, n_tokens - hit, hit, computed)

    a, got_a = admit("a", 600 * BLOCK, 7)
    out["a_admitted"] = got_a is not None
    out["free_after_a"] = pool.get_num_free_blocks()
    b, got_b = admit("b", 600 * BLOCK, 50_000)  # would need more pages than the limit leaves
    out["b_admitted"] = got_b is not None
    mgr.free(a)
    b2, got_b2 = admit("b2", 600 * BLOCK, 50_000)
    out["b_after_free_admitted"] = got_b2 is not None
    if hasattr(pool, "backing"):
        out["mapped_pages"] = pool.backing.pages.mapped_pages
        out["budget_pages"] = pool.backing.pages.limit_pages
        pool.backing.check_invariants()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
