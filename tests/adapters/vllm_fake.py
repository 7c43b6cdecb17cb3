"""A stand-in for vLLM's ``vllm.v1.core.block_pool`` (0.26-0.32 behaviour) for tests without
vLLM: the same public calls and the same free-queue semantics the elastic pool relies on.

* the free queue is a doubly linked list between two sentinel blocks (``fake_free_list_head`` /
  ``_tail``) with ``num_free_blocks``; ``popleft_n`` takes from the head, ``remove`` unlinks;
* block 0 is popped at start as the null block;
* ``get_new_blocks`` pops from the head, evicts a popped block's cached hash, raises ref counts;
* ``free_blocks`` drops ref counts; blocks reaching 0 without a hash go back to the head (reused
  first), hashed ones to the tail (evicted last, LRU);
* ``touch`` takes ref-0 (cached) blocks out of the queue.

``install(monkeypatch)`` puts it in ``sys.modules`` and returns a freshly imported
``workbench.adapters.vllm.pool`` built over it.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterable


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free_block", "next_free_block",
                 "is_null")

    def __init__(self, block_id: int):
        self.block_id, self.ref_cnt, self.block_hash = block_id, 0, None
        self.prev_free_block = self.next_free_block = None
        self.is_null = False


class FreeKVCacheBlockQueue:
    def __init__(self, blocks: list[KVCacheBlock]):
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        chain = [self.fake_free_list_head, *blocks, self.fake_free_list_tail]
        for a, b in zip(chain, chain[1:], strict=False):
            a.next_free_block, b.prev_free_block = b, a

    def popleft(self) -> KVCacheBlock:
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        assert self.num_free_blocks >= n
        out = []
        for _ in range(n):
            blk = self.fake_free_list_head.next_free_block
            assert blk is not self.fake_free_list_tail
            self.remove(blk)
            out.append(blk)
        return out

    def remove(self, blk: KVCacheBlock) -> None:
        blk.prev_free_block.next_free_block = blk.next_free_block
        blk.next_free_block.prev_free_block = blk.prev_free_block
        blk.prev_free_block = blk.next_free_block = None
        self.num_free_blocks -= 1

    def _insert_after(self, where: KVCacheBlock, blk: KVCacheBlock) -> None:
        nxt = where.next_free_block
        blk.prev_free_block, blk.next_free_block = where, nxt
        where.next_free_block = nxt.prev_free_block = blk
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        for blk in blocks:
            self._insert_after(self.fake_free_list_tail.prev_free_block, blk)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        for blk in reversed(blocks):
            self._insert_after(self.fake_free_list_head, blk)

    def ids(self) -> list[int]:
        out, node = [], self.fake_free_list_head.next_free_block
        while node is not self.fake_free_list_tail:
            out.append(node.block_id)
            node = node.next_free_block
        return out


class BlockPool:
    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int,
                 *args, **kwargs):
        self.num_gpu_blocks, self.enable_caching = num_gpu_blocks, enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached: dict[object, KVCacheBlock] = {}  # hash -> block
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def cache_block(self, block: KVCacheBlock, block_hash: object) -> None:
        """vLLM's cache_full_blocks for one full block (the test decides the hash)."""
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def get_cached_block(self, block_hash: object) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        out = self.free_block_queue.popleft_n(num_blocks)
        for blk in out:
            if self.enable_caching:
                self._maybe_evict_cached_block(blk)
            assert blk.ref_cnt == 0
            blk.ref_cnt += 1
        return out

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        h = block.block_hash
        if h is None or self.cached.get(h) is not block:
            return False
        del self.cached[h]
        block.block_hash = None
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        for blk in blocks:
            if blk.ref_cnt == 0 and not blk.is_null:
                self.free_block_queue.remove(blk)
            blk.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        first, last = [], []
        for blk in ordered_blocks:
            blk.ref_cnt -= 1
            if blk.ref_cnt == 0 and not blk.is_null:
                (first if blk.block_hash is None or not self.enable_caching else last).append(blk)
        self.free_block_queue.prepend_n(first)
        self.free_block_queue.append_n(last)

    def reset_prefix_cache(self) -> bool:
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:
            return False
        self.cached.clear()
        for blk in self.blocks:
            blk.block_hash = None
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / total if total else 0.0


def install(monkeypatch) -> types.ModuleType:
    """This stand-in as ``vllm.v1.core.block_pool``; returns the elastic pool module over it."""
    names = ["vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.block_pool"]
    for name in names:
        mod = types.ModuleType(name)
        mod.__path__ = []  # a package, so the next name imports under it
        monkeypatch.setitem(sys.modules, name, mod)
    bp = sys.modules["vllm.v1.core.block_pool"]
    bp.BlockPool, bp.KVCacheBlock, bp.FreeKVCacheBlockQueue = (BlockPool, KVCacheBlock,
                                                                FreeKVCacheBlockQueue)
    monkeypatch.delitem(sys.modules, "workbench.adapters.vllm.pool", raising=False)
    pool = importlib.import_module("workbench.adapters.vllm.pool")
    # the next import (after the test) must not see a pool built over this stand-in
    monkeypatch.setitem(sys.modules, "workbench.adapters.vllm.pool", pool)
    return pool
