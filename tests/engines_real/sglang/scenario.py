"""SGLang's mem_cache classes (0.5.23 or 0.5.16) on CPU tensors, stock or elastic
(WORKBENCH_KV_AUTOPATCH=1).

Prints one ``RESULT {json}`` line; the test compares the stock run with the elastic run and checks
the elastic-only facts (misses, residency, cache bound). Run as a script, in the SGLang venv.
"""

from __future__ import annotations

import json
import os
import sys
import time
from array import array

t0 = time.time()
import sglang  # noqa: E402
import torch  # noqa: E402
from sglang.srt.mem_cache.allocator import (  # noqa: E402
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import (  # noqa: E402
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
)
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

from workbench.adapters import boot  # noqa: E402
from workbench.host.device import rss_shmem  # noqa: E402

IMPORT_S = time.time() - t0
OLD = sglang.__version__.startswith("0.5.16")  # no on_release hook, no runtime_context
DEV = os.environ.get("WORKBENCH_TEST_SGLANG_DEVICE", "cpu")  # gpu_scenario.py: "cuda"
# 8 heads x 128 dims x fp16 = 2 KiB per token per layer: a 2 MiB page holds 1024 slots
HEADS, DIM, LAYERS, SIZE = 8, 128, 2, 8192


def radix_key(seq) -> RadixKey:
    """0.5.16 keys its tree by token lists (as its ``cache_finished_req`` does), 0.5.23 by
    arrays; one tree must not mix them."""
    return RadixKey(list(seq) if OLD else array("q", seq))


def pool_and_alloc(page_size: int):
    kv = MHATokenToKVPool(size=SIZE, page_size=page_size, dtype=torch.float16, head_num=HEADS,
                          head_dim=DIM, layer_num=LAYERS, device=DEV, enable_memory_saver=False,
                          enable_alt_stream=False)
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(size=SIZE, dtype=torch.float16, device=DEV, kvcache=kv,
                                       need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(size=SIZE, page_size=page_size, dtype=torch.float16,
                                            device=DEV, kvcache=kv, need_sort=False)
    return kv, alloc


def radix_flow(page_size: int) -> dict:
    """The stock flow of the feasibility demo: insert A, match B's prefix, insert B, lock, evict."""
    kv, alloc = pool_and_alloc(page_size)
    out = {"class": type(alloc).__name__, "pool": type(kv).__name__,
           "k_shape": list(kv.k_buffer[0].shape), "available0": alloc.available_size()}
    req_pool = ReqToTokenPool(size=4, max_context_len=256, device=DEV, enable_memory_saver=False)
    cache = RadixCache(CacheInitParams(disable=False, req_to_token_pool=req_pool,
                                       token_to_kv_pool_allocator=alloc, page_size=page_size))
    shared = list(range(100, 132))
    seq_a, seq_b = shared + list(range(1, 17)), shared + [9] * 8
    kv_a = alloc.alloc(len(seq_a))
    kv.k_buffer[1][kv_a] = 1.5  # write K of layer 1 through the engine's own buffer
    out["readback"] = float(kv.get_key_buffer(1)[kv_a].float().mean())
    out["insert_a"] = cache.insert(InsertParams(key=radix_key(seq_a), value=kv_a)
                                   ).prefix_len
    m = cache.match_prefix(MatchPrefixParams(key=radix_key(seq_b)))
    hit = len(m.device_indices) if OLD else m.device_prefix_len
    out["hit_b"] = hit
    kv_b_new = alloc.alloc(len(seq_b) - hit)
    out["insert_b"] = cache.insert(InsertParams(key=radix_key(seq_b),
                                                value=torch.cat([kv_a[:hit], kv_b_new]))
                                   ).prefix_len
    out["tree_tokens"] = cache.total_size()
    node = cache.match_prefix(MatchPrefixParams(key=radix_key(seq_b))).last_device_node
    cache.inc_lock_ref(node)
    out["evictable_locked"] = cache.evictable_size()
    out["evicted"] = cache.evict(EvictParams(num_tokens=1000)).num_tokens_evicted
    out["available_after"] = alloc.available_size()
    cache.dec_lock_ref(node)
    if OLD:  # 0.5.16: the bound follows a finished request's insert
        finish_request(cache, req_pool, alloc, shared + [7] * 16)
    else:  # the finish hook SGLang calls after a request's row is released (bound applies here)
        cache.on_release(None, checkpointed=True)
    out["evictable_after_release"] = cache.evictable_size()
    return out


def finish_request(cache, req_pool, alloc, seq: list[int]) -> None:
    """What SGLang 0.5.16's scheduler does for one request: match its prefix and lock it, take
    slots for the rest, fill its ``req_to_token`` row, then ``cache_finished_req``."""
    from types import SimpleNamespace

    m = cache.match_prefix(MatchPrefixParams(key=radix_key(seq)))
    hit = len(m.device_indices)
    cache.inc_lock_ref(m.last_device_node)
    row = torch.cat([m.device_indices.to(torch.int64), alloc.alloc(len(seq) - hit)])
    req_pool.req_to_token[0, :len(seq)] = row.to(req_pool.req_to_token.dtype)
    req = SimpleNamespace(origin_input_ids=list(seq), output_ids=[], req_pool_idx=0,
                          extra_key=None, cache_protected_len=hit, priority=0,
                          last_node=m.last_device_node)
    cache.cache_finished_req(req, kv_len_to_handle=len(seq))


def mla_pool() -> dict:
    """SGLang's MLA pool (DeepSeek-style latent cache: rank 512 + rope 64): shape, a write read
    back through get_key_buffer, and (elastic) what it maps."""
    kv = MLATokenToKVPool(size=SIZE, page_size=1, dtype=torch.bfloat16, kv_lora_rank=512,
                          qk_rope_head_dim=64, layer_num=LAYERS, device=DEV,
                          enable_memory_saver=False)
    slots = torch.arange(1, 33, device=DEV)
    kv.kv_buffer[1][slots] = 2.5
    out = {"pool": type(kv).__name__, "shape": list(kv.kv_buffer[0].shape),
           "readback": float(kv.get_key_buffer(1)[slots].float().mean())}
    led = getattr(kv, "ledger", None)
    if led is not None:
        out.update(layout=led.geometry.layout.value, mapped=led.mapped_bytes,
                   page_id=led.geometry.page_id_bytes)
    return out


def elastic_facts() -> dict:
    facts: dict = {}
    for page_size in (1, 16):
        kv, alloc = pool_and_alloc(page_size)
        led = kv.ledger
        base = rss_shmem()
        f = {"mapped0": led.mapped_bytes}
        ids = alloc.alloc(4096)  # 4096 slots of 2 KiB x 2 layers x K,V: 4 more pages
        f["rss_up_mib"] = (rss_shmem() - base) >> 20
        f["mapped_up"] = led.mapped_bytes
        alloc.free(ids)
        f["rss_down_mib"] = (rss_shmem() - base) >> 20
        f["mapped_down"] = led.mapped_bytes
        # shrink the pool to 2 page ids: every allocation path misses with None, none raises
        led.set_limit(2 * led.geometry.page_id_bytes)
        f["available_limited"] = alloc.available_size()
        f["alloc_miss"] = alloc.alloc(SIZE // 2) is None
        if page_size > 1:
            bs = 4
            prefix = torch.zeros(bs, dtype=torch.int64)
            seq = torch.full((bs,), 1024, dtype=torch.int64)
            last = torch.full((bs,), -1, dtype=torch.int64)
            f["alloc_extend_miss"] = alloc.alloc_extend(prefix, prefix, seq, seq, last,
                                                        int(seq.sum())) is None
            got = alloc.alloc_extend(prefix[:1], prefix[:1], seq[:1] // 64, seq[:1] // 64,
                                     last[:1], 16)
            f["alloc_extend_small"] = None if got is None else int(got.numel())
            dec_seq = torch.full((2,), 17, dtype=torch.int64)  # each decode opens a new page
            dec_last = got[-1:].repeat(2) if got is not None else last[:2]
            led.set_limit(led.mapped_bytes)  # nothing new may map
            held = alloc.alloc(alloc.available_size())  # take what is left on mapped pages
            f["alloc_decode_miss"] = alloc.alloc_decode(dec_seq, dec_seq, dec_last) is None
            if held is not None:
                alloc.free(held)
        facts[f"page_size_{page_size}"] = f
    return facts


def free_group_and_decode(page_size: int) -> dict:
    """Frees between ``free_group_begin`` and ``free_group_end`` land at the end (each version
    has its own free-group protocol); at page size 16 a decode step's slots: a request whose
    new token opens a page gets a fresh page, the other writes right after its last slot."""
    kv, alloc = pool_and_alloc(page_size)
    led = kv.ledger
    before = led.used_blocks
    a, b = alloc.alloc(64), alloc.alloc(64)
    held = led.used_blocks
    alloc.free_group_begin()
    alloc.free(a)
    alloc.free(b)
    out = {"held": held - before, "in_group": led.used_blocks - before}
    alloc.free_group_end()
    out["after_group"] = led.used_blocks - before
    if page_size > 1:
        got = alloc.alloc(32)
        p0, p1 = int(got[0]) // page_size, int(got[-1]) // page_size
        seq = torch.tensor([33, 20], dtype=torch.int64)
        last = torch.tensor([p1 * page_size + 15, p0 * page_size + 2], dtype=torch.int64)
        slots = alloc.alloc_decode(seq, seq, last).tolist()
        out["decode"] = {"opens_page": slots[0] % page_size == 0
                         and slots[0] // page_size not in (p0, p1),
                         "continues": slots[1] == p0 * page_size + 3}
    return out


def leak_check() -> dict:
    """SGLang's idle leak check on an elastic allocator held under a limit: the stock accounting
    (available + protected == total) would call the limit a leak; the patched check does not."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from sglang.srt.managers.scheduler_components.invariant_checker import (
        SchedulerInvariantChecker as Checker,
    )
    from sglang.srt.managers.scheduler_components.pool_stats_observer import PoolStats

    kv, alloc = pool_and_alloc(1)
    alloc.alloc(1000)
    kv.ledger.set_limit(kv.ledger.mapped_bytes)  # nothing new may map: available drops
    avail = alloc.available_size()
    checker = SimpleNamespace(
        token_to_kv_pool_allocator=alloc, is_hybrid_swa=False, is_hybrid_ssm=False,
        tree_cache=SimpleNamespace(protected_size=lambda: 1000), max_total_num_tokens=SIZE,
        pool_stats_observer=SimpleNamespace(session_held_tokens=lambda: 0),
        server_args=SimpleNamespace(dcp_size=1),  # 0.5.16 reads DCP there
        _check_pool_invariant=Checker._check_pool_invariant)
    ps = PoolStats(full_num_used=1000, full_token_usage=1000 / SIZE, full_available_size=avail,
                   full_evictable_size=0)
    if OLD:
        parallel = nullcontext()
    else:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel().override(dcp_enabled=False)
    with parallel:
        patched = Checker._check_full_pool(checker, ps)[0]
    return {"available": avail, "stock_leak": Checker._check_pool_invariant(
        "full", avail, 0, 1000, 0, SIZE)[0], "patched_leak": patched}


def kvctl_idle() -> dict:
    """A ``workbench kvctl limit`` from another process reaches an idle engine: SGLang's pool
    stats ask ``available_size()`` while idle, and that applies the request."""
    import subprocess

    name = f"sglcpu{os.getpid()}"
    os.environ["WORKBENCH_KV_IPC_NAME"] = name
    try:
        kv, alloc = pool_and_alloc(1)
    finally:
        del os.environ["WORKBENCH_KV_IPC_NAME"]
    led = kv.ledger
    want = 2 * led.geometry.page_id_bytes
    out = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "limit", name, str(want),
                          "--wait", "0"], capture_output=True, text=True, timeout=120)
    before = led.limit_bytes
    alloc.available_size()  # what SGLang's idle pool stats do
    result = {"kvctl_rc": out.returncode, "limit_before_poll": before == want,
              "limit_after_poll": led.limit_bytes == want,
              "outcome": led.limit_state.outcome.value}
    led.close()
    return result


def main() -> None:
    result = {"import_s": round(IMPORT_S, 1), "patches": boot.status(),
              "flows": {str(ps): radix_flow(ps) for ps in (1, 16)}, "mla": mla_pool()}
    if any(r["status"] == "applied" for r in result["patches"]):
        result["elastic"] = elastic_facts()
        result["free_group"] = {str(ps): free_group_and_decode(ps) for ps in (1, 16)}
        result["leak_check"] = leak_check()
        result["kvctl_idle"] = kvctl_idle()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
