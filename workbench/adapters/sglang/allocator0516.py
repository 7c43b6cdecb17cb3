"""The elastic allocators for SGLang 0.5.16, whose allocator API differs from 0.5.23's in three
places (read from the 0.5.16 wheel):

* Free groups: a flag (``is_not_in_free_group``) with a list that is always there, where 0.5.23
  uses ``free_group is None``; ``free_group_end`` frees the group's tensors through ``free``.
* The paged allocator frees *token* indices (``free`` turns them into unique page ids); there is
  no ``free_page_ids``/``_release_page_ids``.
* The paged allocator always runs SGLang's Triton kernels and has no ``alloc_decode_naive``:
  the elastic one runs the kernels on CUDA and its own torch fill on the CPU.
"""

from __future__ import annotations

import torch

from workbench.adapters.sglang.allocator import (
    ElasticPagedTokenToKVPoolAllocator,
    ElasticTokenToKVPoolAllocator,
)


class _FreeGroup0516:
    def _reset(self) -> None:
        super()._reset()
        self.is_not_in_free_group = True
        self.free_group = []

    def _defer(self, free_index: torch.Tensor) -> bool:
        """Inside ``free_group_begin``/``end``: keep the indices for the group's one free."""
        if self.is_not_in_free_group:
            return False
        self.free_group.append(free_index)
        return True


class ElasticTokenToKVPoolAllocator0516(_FreeGroup0516, ElasticTokenToKVPoolAllocator):
    def free(self, free_index: torch.Tensor):
        if free_index.numel() == 0 or self._defer(free_index):
            return
        self._free_blocks(free_index.tolist())


class ElasticPagedTokenToKVPoolAllocator0516(_FreeGroup0516, ElasticPagedTokenToKVPoolAllocator):
    def _use_triton(self) -> bool:
        return torch.device(self.device).type == "cuda"

    def clear(self):
        self._reset()

    def free(self, free_index: torch.Tensor):
        if free_index.numel() == 0 or self._defer(free_index):
            return
        pages = torch.unique(free_index // self.page_size).tolist()
        if pages:
            self._free_blocks(pages)

    def _decode_naive(self, seq_lens, last_loc, pages, out, num_new_pages: int) -> None:
        """A decode token opens a new page when it is the first of one (its position,
        ``seq_len - 1``, is a multiple of the page size); the k-th such request takes the
        k-th new page. Every other request writes right after its last slot."""
        opens = (seq_lens - 1) % self.page_size == 0
        out.copy_(last_loc + 1)
        if num_new_pages:
            rank = torch.cumsum(opens.to(torch.int64), 0) - 1
            firsts = pages[rank.clamp(min=0)] * self.page_size
            out.copy_(torch.where(opens, firsts, out))
