"""Two vLLM 0.34 engines' KV caches on one card, built from vLLM 0.34's real classes on the host
device (the card: a host device of ``WORKBENCH_KV_GPU_BUDGET`` bytes, shared by every pool).

Each engine does what vLLM's worker does with the extensible cache: pad the planned tensor to the
commit granule (``pad_kv_cache_segments``), build ``ExtensibleKVCache``, allocate through
``allocate_kv_cache(..., allocate=cache.allocate)``, size after warm-up, commit, build the
scheduler's ``BlockPool``. Both start with vLLM's defaults (``gpu_memory_utilization`` 1.0: the
capacity is the whole card). ``argv[1]``:

* ``elastic``: the plan's sizing (``gpu_worker.measure_kv_cache_blocks``, patched) keeps the
  capacity; pages follow held blocks and the budget decides who backs what.
* ``stock``: vLLM's own measurement (``measure_kv_cache_bytes``, from the card's free memory,
  once) and its commit. vLLM's ``ExtensibleTensor`` needs CUDA VMM, so the commit it would make
  (a physical prefix of that many blocks) is made here by holding that prefix in the ledger.

Prints ``RESULT {json}``.
"""

from __future__ import annotations

import json
import sys

import torch
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker import extensible_kv_cache as ekc
from vllm.v1.worker import gpu_worker
from vllm.v1.worker.utils import allocate_kv_cache

from workbench import backends
from workbench.adapters import boot, runtime
from workbench.adapters.vllm.ledger import PoolExhausted
from workbench.units import MiB

CPU = torch.device("cpu")
LAYOUT = KVCacheLayout.LBHNC  # layer-outermost, block-compact: one segment per layer
SPEC = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16)
NAMES = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
MARGIN = 4 * MiB  # vLLM's 1 GiB margin floor, scaled to this card


def planned(capacity_bytes: int) -> KVCacheConfig:
    """What vLLM's KV planning hands a worker for ``capacity_bytes``: one tensor, its layers'
    blocks back to back (``layer_stride = num_blocks * block_stride``)."""
    stride = SPEC.page_size_bytes
    n = capacity_bytes // (len(NAMES) * stride)
    t = KVCacheTensor(size=len(NAMES) * n * stride, layers=list(NAMES), layer_stride=n * stride,
                      block_stride=stride)
    return KVCacheConfig(num_blocks=n, kv_cache_tensors=[t],
                         kv_cache_groups=[KVCacheGroupSpec(list(NAMES), SPEC)])


class Engine:
    def __init__(self, name: str, card, mode: str):
        page = runtime.pool_config().page_size
        self.card, self.name = card, name
        init_free = card.mem_info().free
        cfg = ekc.pad_kv_cache_segments(planned(card.mem_info().total), LAYOUT, page)
        self.cache = ekc.ExtensibleKVCache(cfg, CPU, LAYOUT)
        self.views = allocate_kv_cache(cfg, CPU, LAYOUT, allocate=self.cache.allocate)
        self.ledger = self.cache.buffer.ledger
        if mode == "elastic":
            n = gpu_worker.measure_kv_cache_blocks(self.cache, None, CPU,
                                                   init_free_memory=init_free,
                                                   requested_memory=card.mem_info().total)
        else:
            kv_bytes = ekc.measure_kv_cache_bytes(
                init_free_memory=init_free, free_memory=card.mem_info().free,
                committed_bytes=self.cache.physical_bytes,
                requested_memory=card.mem_info().total, margin_floor_bytes=MARGIN)
            n = self.cache.blocks_within(kv_bytes)
        self.blocks = n
        self.pool = None
        if n > 1:
            self.cache.commit(n, shrink=True)
            if mode == "stock":  # what vLLM's ExtensibleTensor commit maps: the prefix
                self.ledger.hold(range(1, n))
            self.pool = BlockPool(n, True, SPEC.block_size)

    def take(self, num: int) -> list | None:
        """``num`` new blocks, or None on a miss (vLLM's scheduler preempts or waits)."""
        try:
            return self.pool.get_new_blocks(num)
        except PoolExhausted:
            return None

    def state(self) -> dict:
        return {"blocks": self.blocks, "capacity_blocks": self.cache.capacity_blocks,
                "mapped_bytes": self.ledger.mapped_bytes,
                "pool": type(self.pool).__name__ if self.pool else None}


def views_are_the_ledgers_memory(e: Engine) -> dict:
    """A block written through vLLM's layer view lands at the ledger's bytes (one base pointer);
    a block no one holds reads the zero page."""
    (blk,) = e.take(1)
    view = e.views[NAMES[1]]
    view[blk.block_id].fill_(7)
    raw = e.cache.buffer.full_view()
    off = e.cache.segment_offsets[1] + blk.block_id * SPEC.page_size_bytes
    landed = bool((raw[off:off + SPEC.page_size_bytes].view(SPEC.dtype) == 7).all())
    far = e.cache.capacity_blocks - 1  # never held: its page is not backed
    unbacked = bool((view[far] == 0).all()) and not e.ledger.is_held(far)
    e.pool.free_blocks([blk])
    return {"written_block_landed": landed, "unheld_block_reads_zero": unbacked,
            "same_base": raw.data_ptr() == e.ledger.space.base}


def main(mode: str) -> dict:
    card = backends.shared_device(CPU)
    out: dict = {"mode": mode, "card_bytes": card.mem_info().total,
                 "patches": [f"{r.patch}:{r.status}" for r in boot.plans()["vllm"].records]}
    a = Engine("A", card, mode)
    out["a_start"] = a.state()
    out["card_free_after_a_start"] = card.mem_info().free
    if mode == "elastic":
        out["views"] = views_are_the_ledgers_memory(a)
        out["a_took"] = a.take(1024) is not None  # A serves a load: 16 MiB of blocks
    b = Engine("B", card, mode)
    out["b_start"] = b.state()
    out["card_free_after_b_start"] = card.mem_info().free
    if b.pool is None:
        return out
    held_b = b.take(1024)
    out["b_took"] = held_b is not None
    out["mapped_a_b"] = [a.ledger.mapped_bytes, b.ledger.mapped_bytes]
    # A bursts past what the card has left: the budget refuses (a miss), nothing crashes
    out["a_burst"] = a.take(2048) is not None
    b.pool.free_blocks(held_b)
    b.ledger.reap(wait=True)
    out["a_burst_after_b_freed"] = a.take(2048) is not None
    out["mapped_after"] = [a.ledger.mapped_bytes, b.ledger.mapped_bytes]
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
