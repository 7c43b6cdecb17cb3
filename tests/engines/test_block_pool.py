from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from workbench.engines.sched.block_pool import BlockPool, hash_chain
from workbench.engines.sched.eviction import cap_blocks

from ._helpers import in_use_pages, make_kv


def test_hash_chain_is_prefix_sensitive_and_deterministic():
    a = hash_chain(list(range(16)), 4)
    assert len(a) == 4 and a == hash_chain(list(range(16)), 4)
    b = hash_chain([99] + list(range(1, 16)), 4)  # first token changed: every block differs
    assert all(x != y for x, y in zip(a, b, strict=False))
    c = hash_chain(list(range(15)) + [99], 4)  # last token changed: only the last block
    assert a[:3] == c[:3] and a[3] != c[3]
    assert hash_chain(list(range(18)), 4, a[:2]) == a  # extends a prior chain; partial ignored


def test_cache_key_includes_group_and_all_groups_must_hit():
    pool = BlockPool(make_kv())
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks[:1], [111], 0, 1, group_id=0)
    pool.cache_full_blocks(blocks[1:], [111], 0, 1, group_id=1)
    assert pool.get_cached_block(111, (0,)) == [blocks[0]]
    assert pool.get_cached_block(111, (0, 1)) == blocks
    assert pool.get_cached_block(111, (0, 2)) is None  # one group misses -> no hit at all
    assert pool.get_cached_block(222) is None


def test_null_block_is_reserved_and_never_freed():
    pool = BlockPool(make_kv())
    assert pool.null_block == 0
    ids = pool.get_new_blocks(5)
    assert 0 not in ids
    pool.free_blocks([0] + ids)  # the null block is skipped
    assert 0 in pool.kv.allocated


def test_ref_counts_and_lru_of_cached_blocks():
    pool = BlockPool(make_kv())
    b = pool.get_new_blocks(3)
    pool.cache_full_blocks(b, [1, 2, 3], 0, 2)  # the third stays uncached
    pool.touch(b[:1])
    assert pool.ref[b[0]] == 2
    pool.free_blocks(reversed(b))
    assert list(pool.evictable) == [b[1]]  # b[0] still held; b[2] uncached -> back to ledger
    assert b[2] not in pool.kv.allocated
    pool.free_blocks(b[:1])
    assert list(pool.evictable) == [b[1], b[0]]
    pool.touch([b[1]])  # a hit revives it
    assert list(pool.evictable) == [b[0]] and pool.ref[b[1]] == 1
    pool.check_invariants()


def test_shortage_evicts_lru_first():
    kv = make_kv(num_blocks=9, blocks_per_page=4)  # 8 usable blocks
    pool = BlockPool(kv)
    b = pool.get_new_blocks(8)
    pool.cache_full_blocks(b, list(range(100, 108)), 0, 8)
    pool.free_blocks(b)  # LRU order = b
    assert pool.num_free_blocks() == 8
    got = pool.get_new_blocks(3)
    assert got is not None and pool.evicted_lru == 3
    assert list(pool.evictable) == b[3:]
    assert pool.get_new_blocks(6) is None  # more than free + evictable: a miss, nothing changes
    assert len(pool.evictable) == 5


def test_cap_semantics_unlimited_zero_bounded():
    assert (cap_blocks(-1, 16), cap_blocks(0, 16), cap_blocks(100, 16), cap_blocks(3, 16)) == \
        (-1, 0, 6, 1)
    for cap, kept in ((-1, 8), (0, 0), (16, 4)):
        pool = BlockPool(make_kv(max_cached_tokens=cap))  # block_size 4: 16 tokens = 4 blocks
        b = pool.get_new_blocks(8)
        pool.cache_full_blocks(b, list(range(8)), 0, 8)
        pool.free_blocks(b)
        # page-aware eviction takes whole pages, so a bound N may end a page's worth below N
        assert kept - 4 < len(pool.evictable) <= kept or len(pool.evictable) == kept == 0, cap
        pool.check_invariants()


def _fragmented(page_aware: bool):
    """16 pages of 4 blocks; cached blocks interleaved with live ones on half the pages."""
    kv = make_kv(num_blocks=64, blocks_per_page=4, max_cached_tokens=8 * 4)
    pool = BlockPool(kv, page_aware=page_aware)
    live, cached = [], []
    for i in range(15):
        ids = pool.get_new_blocks(4 if i != 0 else 3)
        if i % 2:  # one live block per odd page, the rest cached
            live.append(ids[0])
            cached.extend(ids[1:])
        else:
            cached.extend(ids)
    pool.cache_full_blocks(cached, list(range(1000, 1000 + len(cached))), 0, len(cached))
    # free odd pages' cached blocks first: they are the LRU-oldest
    odd = [b for b in cached if kv.geometry.block_page(b) % 2]
    even = [b for b in cached if not kv.geometry.block_page(b) % 2]
    pool.free_blocks(odd + even)
    return kv, pool, live


def test_page_aware_eviction_empties_whole_pages_lru_does_not():
    kv_pa, pool_pa, _ = _fragmented(True)
    kv_lru, pool_lru, _ = _fragmented(False)
    assert len(pool_pa.evictable) <= 8 and len(pool_lru.evictable) <= 8
    # page-aware takes whole cached-only (even) pages; LRU takes the oldest (odd, pinned) pages
    assert in_use_pages(kv_pa) < in_use_pages(kv_lru)
    pool_pa.check_invariants()
    pool_lru.check_invariants()


class BlockPoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pool = BlockPool(make_kv(num_blocks=40, blocks_per_page=4, max_cached_tokens=24))
        self.held: list[list[int]] = []
        self.next_hash = 0

    @rule(n=st.integers(0, 6), cache=st.booleans())
    def alloc(self, n, cache):
        ids = self.pool.get_new_blocks(n)
        if ids is None:
            assert n > self.pool.num_free_blocks()
            return
        assert len(ids) == n and len(set(ids)) == n
        if cache and ids:
            hashes = list(range(self.next_hash, self.next_hash + n))
            self.next_hash += n
            self.pool.cache_full_blocks(ids, hashes, 0, n)
        self.held.append(ids)

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        ids = self.held.pop(i % len(self.held))
        self.pool.free_blocks(reversed(ids))

    @precondition(lambda self: self.pool.evictable)
    @rule(i=st.integers(0, 100))
    def hit(self, i):
        b = list(self.pool.evictable)[i % len(self.pool.evictable)]
        key = self.pool.key_of[b]
        assert self.pool.get_cached_block(key[0]) == [b]
        self.pool.touch([b])
        self.held.append([b])

    @invariant()
    def consistent(self):
        self.pool.check_invariants()
        self.pool.kv.check_invariants()
        cap = self.pool.max_cached_blocks
        assert cap < 0 or len(self.pool.evictable) <= cap


TestBlockPoolMachine = BlockPoolMachine.TestCase
TestBlockPoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
