from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from workbench.engines.radix_cache import RadixCache

from ._helpers import in_use_pages, make_kv


def _cache(page: int = 1, cap: int = -1, num_blocks: int = 256, bpp: int = 8, **kw):
    return RadixCache(make_kv(num_blocks, blocks_per_page=bpp, block_size=page,
                              max_cached_tokens=cap), **kw)


def _put(cache: RadixCache, tokens: list[int]) -> list[int]:
    n = len(tokens) // cache.page
    ids = cache.alloc(n)
    prefix = cache.insert(tokens[:n * cache.page], ids)
    cache.free([b for b in ids[:prefix // cache.page] if b not in cache.owner])
    return ids


def test_match_insert_split_token_level():
    c = _cache()
    _put(c, [1, 2, 3, 4, 5])
    blocks, node = c.match_prefix([1, 2, 3, 9])
    assert len(blocks) == 3 and node.key == (1, 2, 3)  # the node was split at 3
    _put(c, [1, 2, 3, 9, 9])
    assert len(c.match_prefix([1, 2, 3, 9, 9, 7])[0]) == 5
    assert len(c.match_prefix([1, 2, 3, 4, 5])[0]) == 5
    assert c.match_prefix([7])[0] == []
    c.check_invariants()


def test_page_aligned_keys():
    c = _cache(page=4)
    _put(c, list(range(10)))  # only 8 tokens (two pages) are cached
    assert c.cached_tokens == 8
    assert len(c.match_prefix(list(range(7)) + [99])[0]) == 1  # 7 shared -> one whole page
    assert len(c.match_prefix(list(range(12)))[0]) == 2
    c.check_invariants()


def test_lock_ref_protects_from_eviction():
    c = _cache()
    _put(c, [1, 2, 3, 4])
    _put(c, [5, 6, 7, 8])
    blocks, node = c.match_prefix([1, 2, 3, 4])
    c.inc_lock_ref(node)
    assert (c.evictable_size, c.protected_size) == (4, 4)
    assert c.evict(100) == 4  # only the unlocked path goes
    assert len(c.match_prefix([1, 2, 3, 4])[0]) == 4
    c.dec_lock_ref(node)
    assert c.evictable_size == 4 and c.evict(100) == 4
    assert c.kv.used_blocks == 0
    c.check_invariants()


def test_cap_semantics_unlimited_zero_bounded():
    for cap, limit in ((-1, None), (0, 0), (12, 12)):
        c = _cache(cap=cap)
        for i in range(6):
            _put(c, [100 * i + k for k in range(8)])
            c.enforce_cap()
        if limit is None:
            assert c.evictable_size == 48
        else:
            assert c.evictable_size <= limit
        c.check_invariants()


def test_alloc_evicts_lru_on_shortage():
    c = _cache(num_blocks=17, bpp=8)  # 16 usable token slots
    _put(c, list(range(8)))
    _put(c, list(range(100, 108)))
    c.match_prefix(list(range(8)))  # touch the first: the second is now LRU
    ids = c.alloc(4)
    assert ids is not None and c.evicted_lru >= 4
    assert len(c.match_prefix(list(range(8)))[0]) == 8
    assert len(c.match_prefix(list(range(100, 108)))[0]) == 0


def test_page_aware_cap_empties_pages_lru_does_not():
    def fill(page_aware: bool):
        c = _cache(page=1, cap=32, num_blocks=257, bpp=8, page_aware=page_aware)
        live = []
        for i in range(12):  # 12 sequences of 16 tokens; odd ones stay live (locked)
            toks = [1000 * i + k for k in range(16)]
            ids = c.alloc(16)
            c.insert(toks, ids)
            if i % 2:
                _, node = c.match_prefix(toks)
                c.inc_lock_ref(node)
                live.append(node)
        c.enforce_cap()
        return c

    pa, lru = fill(True), fill(False)
    assert pa.evictable_size <= 32 and lru.evictable_size <= 32
    assert in_use_pages(pa.kv) <= in_use_pages(lru.kv)
    pa.check_invariants()


class RadixMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.c = _cache(page=2, cap=40, num_blocks=128, bpp=8)
        self.locks = []

    @rule(seq=st.lists(st.integers(1, 4), min_size=2, max_size=16))
    def insert(self, seq):
        n = len(seq) // 2
        if n > self.c.available_blocks():
            return
        ids = self.c.alloc(n)
        assert ids is not None
        prefix = self.c.insert(seq[:2 * n], ids)
        self.c.free([b for b in ids[:prefix // 2] if b not in self.c.owner])
        self.c.enforce_cap()

    @rule(seq=st.lists(st.integers(1, 4), min_size=1, max_size=16), lock=st.booleans())
    def match(self, seq, lock):
        blocks, node = self.c.match_prefix(seq)
        assert len(blocks) * 2 <= len(seq)
        if lock and node is not self.c.root:
            self.c.inc_lock_ref(node)
            self.locks.append(node)

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 50))
    def unlock(self, i):
        self.c.dec_lock_ref(self.locks.pop(i % len(self.locks)))
        self.c.enforce_cap()

    @rule(n=st.integers(0, 20))
    def evict(self, n):
        self.c.evict(n)

    @invariant()
    def consistent(self):
        self.c.check_invariants()
        self.c.kv.check_invariants()
        assert self.c.kv.used_blocks * 2 == self.c.cached_tokens
        assert self.c.evictable_size <= self.c.max_cached_tokens


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
