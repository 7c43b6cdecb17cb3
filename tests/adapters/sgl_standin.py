"""Stand-ins for the SGLang scheduler classes the admission charge patches (the names, parameters
and the attributes the plans' checks read, as in SGLang 0.5.23), with SGLang's rule: admit on
``available_size() + evictable_size()``, then allocate and raise "Out of memory" on a miss. The
allocator is the elastic one's engine-free core with the token allocator's ``available_size``."""

from __future__ import annotations

from array import array
from enum import Enum, auto

from workbench.adapters.sglang.slots import LedgerSlots


class AddReqResult(Enum):
    CONTINUE = auto()
    NO_TOKEN = auto()
    OTHER = auto()


class Req:
    def __init__(self, rid: str, tokens: int, prefix: int = 0):
        self.rid = rid
        self.prefix_len = prefix
        self.full_untruncated_fill_ids = array("q", range(tokens))


class Cache:
    """A radix cache whose entries (finished requests' slots) are all evictable, oldest first."""

    def __init__(self):
        self.entries = []

    def evictable_size(self) -> int:
        return sum(len(e) for e in self.entries)

    def evict(self, allocator, n: int) -> None:
        while n > 0 and self.entries:
            entry = self.entries.pop(0)
            allocator.free_slots(entry)
            n -= len(entry)


class Allocator(LedgerSlots):
    """page_size 1, as ``ElasticTokenToKVPoolAllocator``."""

    def available_size(self) -> int:
        return min(self._room(), self.size - self.ledger.used_blocks)

    def alloc(self, need: int):
        return self._ids(need)


class PrefillAdder:
    def __init__(self, tree_cache, token_to_kv_pool_allocator):
        self.tree_cache = tree_cache
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.can_run_list = []
        self.offset = 0

    def _fits(self, n: int) -> bool:
        room = (self.token_to_kv_pool_allocator.available_size()
                + self.tree_cache.evictable_size())
        return n <= room - self.offset

    def add_one_req(self, req: Req, has_chunked_req: bool = False):
        n = len(req.full_untruncated_fill_ids) - req.prefix_len
        if not self._fits(n):
            return AddReqResult.NO_TOKEN
        self.can_run_list.append(req)
        self.offset += n
        return AddReqResult.CONTINUE

    def add_chunked_req(self, req: Req):
        self.can_run_list.append(req)  # a chunk always runs
        self.offset += len(req.full_untruncated_fill_ids) - req.prefix_len
        return req


class ScheduleBatch:
    def __init__(self, reqs, token_to_kv_pool_allocator, tree_cache):
        self.reqs = reqs
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.tree_cache = tree_cache

    def new_tokens_required_next_decode(self, selected_indices=None):
        return len(self.reqs if selected_indices is None else selected_indices)

    def check_decode_mem(self, selected_indices=None):
        need = self.new_tokens_required_next_decode(selected_indices)
        return self.token_to_kv_pool_allocator.available_size() >= need


def alloc_token_slots(allocator, n: int):
    """SGLang's allocation after admission: a miss raises."""
    out = allocator.alloc(n)
    if out is None:
        raise RuntimeError(f"Out of memory. Try to lower your batch size. Need {n}")
    return out


def admitted_tokens(adder: PrefillAdder) -> int:
    return sum(len(r.full_untruncated_fill_ids) - r.prefix_len for r in adder.can_run_list)


def evict_for(adder: PrefillAdder, n: int) -> None:
    """SGLang's ``evict_from_tree_cache``: evict what the allocator is short of ``n``."""
    short = n - adder.token_to_kv_pool_allocator.available_size()
    if short > 0:
        adder.tree_cache.evict(adder.token_to_kv_pool_allocator, short)


def prepare_for_extend(adder: PrefillAdder):
    """The admitted requests' prefill allocation (``ScheduleBatch.prepare_for_extend``)."""
    n = admitted_tokens(adder)
    if not n:
        return None
    evict_for(adder, n)
    return alloc_token_slots(adder.token_to_kv_pool_allocator, n)
