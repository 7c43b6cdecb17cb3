"""Elastic token-slot and paged allocators: SGLang's allocator API on the workbench ledger.

A miss is ``None`` on every path (``alloc``, ``alloc_extend``, ``alloc_decode``); nothing here
raises on a miss. SGLang itself admits on ``available_size() + evictable_size()`` and its
``alloc_token_slots`` evicts, then raises on ``None`` (docs/sources.md), so ``available_size()``
must stay honest: it counts only slots the ledger can still back. Frees
keep SGLang's free-group batching. Ids are validated by the ledger, so a double free raises
instead of silently duplicating a slot.

On CUDA the ledger's fence (:class:`workbench.adapters.runtime.ReleaseFence`) orders unmaps after
the GPU work queued before each free (SGLang's overlap scheduler frees while the next batch runs):
every free records the fence, every allocation first releases what the GPU has finished, and a
miss waits for the in-flight work once and retries before answering ``None``.
"""

from __future__ import annotations

import torch
from sglang.srt.mem_cache.allocator import paged as _paged
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

from workbench.adapters.sglang.slots import LedgerSlots, ledger_of, page_slots

_ElasticMixin = LedgerSlots  # the allocators below: SGLang's API over LedgerSlots


class ElasticTokenToKVPoolAllocator(_ElasticMixin, TokenToKVPoolAllocator):
    """page_size = 1: one ledger block per token slot."""

    def __init__(self, size, dtype, device, kvcache, need_sort):
        BaseTokenToKVPoolAllocator.__init__(self, size, 1, dtype, device, kvcache, need_sort)
        self.ledger = ledger_of(kvcache)
        self.clear()

    def clear(self):
        self._reset()

    def available_size(self):
        # the ledger's page-count estimate can exceed what is left of the pool: cap by both
        return min(self._room(), self.size - self.ledger.used_blocks)

    def alloc(self, need_size: int):
        return self._ids(need_size)

    def free(self, free_index: torch.Tensor):
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self._copy_for_free_group(free_index))
            return
        self._free_blocks(free_index.tolist())


class ElasticPagedTokenToKVPoolAllocator(_ElasticMixin, PagedTokenToKVPoolAllocator):
    """page_size > 1: one ledger block per SGLang page; slots = page * page_size + offset."""

    def __init__(self, size, page_size, dtype, device, kvcache, need_sort):
        BaseTokenToKVPoolAllocator.__init__(self, size, page_size, dtype, device, kvcache,
                                            need_sort)
        self.num_pages = size // page_size
        self.debug_mode = False
        self.use_triton_kernels = self._use_triton()
        self.ledger = ledger_of(kvcache)
        self.clear()

    def _use_triton(self) -> bool:
        return bool(_paged.current_platform.capabilities.supports_triton)

    def clear(self):
        self._reset()
        self.free_page_ids_group = []
        self.staged_pages = []
        self.num_staged_pages = 0

    def available_size(self):
        left = self.num_pages - self.ledger.used_blocks
        return min(self._room(), left) * self.page_size

    def get_all_free_pages(self):
        return None

    def _debug_check_no_duplicate_pages(self):
        pass  # the ledger refuses duplicates itself

    def alloc(self, need_size: int):
        pages = self._ids(need_size // self.page_size)
        if pages is None:
            return None
        return page_slots(pages, self.page_size)

    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                     extend_num_tokens: int, num_new_pages: int | None = None):
        if num_new_pages is None:
            num_new_pages = _paged.get_num_new_pages(
                seq_lens=seq_lens_cpu, page_size=self.page_size, prefix_lens=prefix_lens_cpu)
        pages = self._ids(int(num_new_pages))
        if pages is None:
            return None
        out = torch.empty((extend_num_tokens,), dtype=torch.int64, device=self.device)
        if self.use_triton_kernels:  # the kernels read exactly the new pages, in order
            bs = len(prefix_lens)
            _paged.alloc_extend_kernel[(bs,)](prefix_lens, seq_lens, last_loc, pages, out,
                                              _paged.next_power_of_2(bs), self.page_size)
        else:
            _paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, pages, out,
                                      self.page_size, self.device)
        return out

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        num_new_pages = int(_paged.get_num_new_pages(
            seq_lens=seq_lens_cpu, page_size=self.page_size, decode=True))
        pages = self._ids(num_new_pages)
        if pages is None:
            return None
        bs = len(seq_lens)
        out = torch.empty((bs,), dtype=torch.int64, device=self.device)
        if self.use_triton_kernels:
            _paged.alloc_decode_kernel[(bs,)](seq_lens, last_loc, pages, out,
                                              _paged.next_power_of_2(bs), self.page_size)
        else:
            self._decode_naive(seq_lens, last_loc, pages, out, num_new_pages)
        return out

    def _decode_naive(self, seq_lens, last_loc, pages, out, num_new_pages: int) -> None:
        _paged.alloc_decode_naive(seq_lens, last_loc, pages, out, self.page_size, num_new_pages)

    def _release_page_ids(self, *page_ids: torch.Tensor):
        ids = torch.cat(page_ids).tolist() if len(page_ids) > 1 else page_ids[0].tolist()
        if ids:
            self._free_blocks(ids)
