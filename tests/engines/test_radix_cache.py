from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from workbench.engines.sched.radix_cache import RadixCache

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


# -- page-aware eviction, cache_unfinished, run allocation ------------------------------------
def _page_of(c: RadixCache, blocks) -> set[int]:
    return {c.geometry.block_page(b) for b in blocks}


def test_cap_empties_a_page_rather_than_the_lru_leaf():
    def build(page_aware: bool) -> RadixCache:
        c = _cache(page=1, cap=14, num_blocks=64, bpp=8, page_aware=page_aware)
        _put(c, list(range(1, 8)))  # 7 blocks: fill page 0 beside the null block (pinned)
        _put(c, list(range(100, 108)))  # 8 blocks on a page of their own, newer
        assert in_use_pages(c.kv) == 2
        c.enforce_cap()
        c.check_invariants()
        return c

    pa, lru = build(True), build(False)
    assert in_use_pages(pa.kv) == 1 and in_use_pages(lru.kv) == 2
    assert len(pa.match_prefix(list(range(1, 8)))[0]) == 7  # the LRU leaf survives
    assert len(lru.match_prefix(list(range(1, 8)))[0]) == 0


def test_cut_counts_the_subtree_it_takes():
    """Emptying the prefix's page takes its child's page too (8 blocks, 2 pages); the ratio
    ties with a 4-block page of its own, and fewer blocks lost wins the tie."""
    c = _cache(page=1, cap=100, num_blocks=64, bpp=4)
    c.kv.alloc(3)  # live blocks fill page 0 beside the null block
    _put(c, [10, 11, 12, 13])
    _put(c, [10, 11, 12, 13, 14, 15, 16, 17])  # the tail on a fresh page; its prefix dup freed
    _put(c, [20, 21, 22, 23])
    assert all(len(_page_of(c, n.value)) == 1 for n in c._nodes() if n is not c.root)
    cut = c._best_page_cut()
    assert len(cut) == 1 and len(cut[0][0].value) - cut[0][1] == 4 and not cut[0][0].children
    c.max_cached_tokens = 11
    c.enforce_cap()  # one page goes, whole
    assert c.evictable_size == 8 and in_use_pages(c.kv) == 3
    assert len(c.match_prefix([10, 11, 12, 13])[0]) == 4  # the shared prefix survives
    c.check_invariants()


def test_peel_drains_the_emptiest_pinned_page_first():
    c = _cache(page=1, cap=4, num_blocks=64, bpp=4)
    c.kv.alloc(3)  # page 0 full (null + 3 live)
    c.kv.alloc(1)  # page 1: one live block pins it
    _put(c, [1, 2, 3])  # older leaf, page 1 (4 of 4 used)
    c.kv.alloc(1)  # page 2: one live block
    _put(c, [7, 8])  # newer leaf, page 2 (3 of 4 used)
    assert c.evictable_size == 5
    c.enforce_cap()  # no page can be emptied: peel one block off the emptiest page (2)
    assert c.evictable_size == 4
    assert len(c.match_prefix([1, 2, 3])[0]) == 3  # LRU would have cut this older leaf
    assert len(c.match_prefix([7, 8])[0]) == 1
    c.check_invariants()


def test_cache_unfinished_shares_a_running_prefix_and_moves_the_lock():
    c = _cache(page=2, num_blocks=64, bpp=8)
    toks = list(range(10))
    ids = c.alloc(5)
    blocks, node = c.cache_unfinished(toks, ids, c.root)
    assert blocks == ids and node is not c.root and c.protected_size == 10
    dup = c.alloc(3)  # a second request computed the first 6 tokens itself
    b2, n2 = c.cache_unfinished(toks[:6], dup, c.root)
    assert b2 == ids[:3] and all(b not in c.kv.allocated for b in dup)  # duplicates freed
    c.dec_lock_ref(n2)
    c.dec_lock_ref(node)
    assert c.protected_size == 0 and c.evictable_size == 10
    c.check_invariants()


def _drive(sched, limit: int = 10_000) -> None:
    for _ in range(limit):
        if not sched.has_work():
            return
        sched.update(sched.schedule(), 0.0)
    raise AssertionError("scheduler did not finish")


def test_sglang_run_allocation_keeps_a_leaf_on_one_page():
    from workbench.engines.sched.request import Request
    from workbench.engines.sched.sglang_sched import SGLangScheduler

    def leaf_pages(run_blocks: int) -> list[int]:
        c = RadixCache(make_kv(64, blocks_per_page=8, block_size=16))
        s = SGLangScheduler(c, run_blocks=run_blocks)
        reqs = [Request(i, [1000 * i + k for k in range(32)], 80) for i in range(2)]
        for r in reqs:  # 32 prompt + 80 output tokens -> 7 blocks each, decoded together
            s.add_request(r)
        _drive(s)
        c.check_invariants()
        return [len(_page_of(c, c.match_prefix(r.tokens)[0])) for r in reqs]

    assert leaf_pages(8) == [1, 1]
    assert max(leaf_pages(0)) > 1  # block-at-a-time decode interleaves the two leaves


def test_sglang_prefix_is_shared_while_its_first_request_decodes():
    from workbench.engines.sched.request import Request

    from ._helpers import run_single

    prefix = list(range(1, 65))
    reqs = [Request(0, prefix + [900], 200, 0.0), Request(1, prefix + [901], 8, 0.5)]
    eng = run_single("sglang", reqs, block_size=16)
    assert reqs[1].prefix_hit_tokens == 64  # inserted after the first prefill, not at finish
    eng.cache.check_invariants()


class LiveRadixMachine(RuleBasedStateMachine):
    """Requests hold live blocks (decode KV not in the tree) and locks; the cap is page-aware.
    Eviction must never touch a live block or a locked path and must keep the bound."""

    def __init__(self):
        super().__init__()
        self.c = _cache(page=1, cap=12, num_blocks=96, bpp=4)
        self.reqs: list[tuple[list[int], list[int], object]] = []  # tokens, blocks, node

    @rule(seq=st.lists(st.integers(1, 3), min_size=1, max_size=10), extra=st.integers(0, 3))
    def start(self, seq, extra):
        blocks, node = self.c.match_prefix(seq)
        need = len(seq) - len(blocks) + extra
        if need > self.c.kv.available_size():
            return
        self.c.inc_lock_ref(node)
        ids = self.c.alloc(need)
        assert ids is not None
        self.reqs.append((list(seq), blocks + ids, node))

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 50))
    def cache_unfinished(self, i):
        toks, blocks, node = self.reqs[i % len(self.reqs)]
        new, node = self.c.cache_unfinished(toks, blocks[:len(toks)], node)
        self.reqs[i % len(self.reqs)] = (toks, new + blocks[len(toks):], node)
        self.c.enforce_cap()

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 50))
    def finish(self, i):
        toks, blocks, node = self.reqs.pop(i % len(self.reqs))
        prefix = self.c.insert(toks, blocks[:len(toks)])
        self.c.free([b for b in blocks[:prefix] if b not in self.c.owner])
        self.c.free(blocks[len(toks):])
        self.c.dec_lock_ref(node)
        self.c.enforce_cap()

    @invariant()
    def consistent(self):
        c = self.c
        c.check_invariants()
        c.kv.check_invariants()
        assert c.evictable_size <= c.max_cached_tokens
        for _toks, blocks, node in self.reqs:
            assert c.kv.allocated.issuperset(blocks)  # live and locked blocks stay
            assert node is c.root or node.lock_ref > 0


TestLiveRadixMachine = LiveRadixMachine.TestCase
TestLiveRadixMachine.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
