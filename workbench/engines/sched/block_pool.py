"""vLLM-style prefix ownership over the elastic ledger (seed 001 §6; kvcached §4.2).

Three layers hold a prefix at once: the *identity* (a hash chain over full blocks whose cache key
also names the KV group), the *engine metadata* (ref counts and an LRU queue of cached blocks no
request holds) and the *physical backing* (the :class:`KVCacheManager` pages). A block with
``ref == 0`` stays allocated in the ledger while it is cached, so its page stays mapped; only
eviction returns it, and the page is unmapped or parked when its last block goes.

Lifecycle: alloc (ref 1) -> touch (ref+1, leaves the LRU) -> free (ref-1); at ref 0 a cached block
joins the LRU tail, an uncached one goes straight back to the ledger. Eviction: above the cached-
token bound it is page-aware (whole pages first), on an allocation shortage it is LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from workbench.core.ledger import KVCacheManager
from workbench.engines.sched.eviction import cap_blocks, page_aware_victims
from workbench.errors import ConfigError

NONE_HASH = 0x5EED  # the parent hash of a sequence's first block


def hash_block(parent: int, tokens: Sequence[int], extra: object = None) -> int:
    """One link of the chain: a block's identity depends on every token before it.

    Python's hash of a tuple of ints is stable across runs (no hash randomisation for ints);
    ``extra`` (LoRA id, multimodal hash...) should be an int or a tuple of ints for the same reason.
    """
    if extra is None:  # hash(None) is address-based before Python 3.12
        return hash((parent, tuple(tokens)))
    return hash((parent, tuple(tokens), extra))


def hash_chain(tokens: Sequence[int], block_size: int, prior: list[int] | None = None,
               extra: object = None) -> list[int]:
    """Hashes of every *full* block of ``tokens``, extending ``prior`` (already-hashed blocks)."""
    out = list(prior or [])
    parent = out[-1] if out else NONE_HASH
    for i in range(len(out) * block_size, len(tokens) - block_size + 1, block_size):
        parent = hash_block(parent, tokens[i:i + block_size], extra)
        out.append(parent)
    return out


class BlockPool:
    """Blocks with ref counts and a prefix cache keyed by ``(block_hash, group_id)``."""

    def __init__(self, kv: KVCacheManager, *, enable_caching: bool = True,
                 max_cached_tokens: int | None = None, page_aware: bool = True):
        if kv.null_block is None:
            raise ConfigError(f"pool {kv.name!r}", "a block pool needs the null block (block 0)",
                              "build the KVCacheManager with reserve_null_block=True")
        self.kv = kv
        self.geometry = kv.geometry
        self.block_size = kv.geometry.block_size
        self.enable_caching = enable_caching
        self.page_aware = page_aware  # False: the cap evicts by LRU too (kvcached before #390)
        tokens = kv.config.max_cached_tokens if max_cached_tokens is None else max_cached_tokens
        self.max_cached_blocks = cap_blocks(tokens, self.block_size)
        self.null_block = kv.null_block
        self.ref = [0] * self.geometry.num_blocks
        self.key_of: dict[int, tuple[int, int]] = {}  # block -> cache key
        self.cached: dict[tuple[int, int], int] = {}  # cache key -> block
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 cached blocks, oldest first
        self.queries = 0
        self.hits = 0
        self.evicted_cap = 0
        self.evicted_lru = 0

    # -- queries -----------------------------------------------------------------------------
    def num_free_blocks(self) -> int:
        """Blocks obtainable now: the ledger's free ones plus cached blocks that can be evicted."""
        return self.kv.available_size() + len(self.evictable)

    def get_cached_block(self, block_hash: int,
                         group_ids: Sequence[int] = (0,)) -> list[int] | None:
        """One block per group, or None unless *every* group hits (a hybrid model needs all)."""
        self.queries += 1
        out = []
        for g in group_ids:
            b = self.cached.get((block_hash, g))
            if b is None:
                return None
            out.append(b)
        self.hits += 1
        return out

    # -- ownership ---------------------------------------------------------------------------
    def touch(self, blocks: Iterable[int]) -> None:
        ev, ref = self.evictable, self.ref
        for b in blocks:
            if ref[b] == 0:
                ev.pop(b, None)
            ref[b] += 1

    def get_new_blocks(self, n: int) -> list[int] | None:
        """n fresh blocks (ref 1) or None; evicts LRU cached blocks on a shortage (two tries)."""
        if n == 0:
            return []
        kv = self.kv
        if not self.evictable:  # nothing to evict: the ledger alone decides (one check)
            ids = kv.alloc(n)
        else:
            avail = kv.available_size()
            if n > avail + len(self.evictable):
                return None
            if n > avail:
                self.evict_lru(n - avail)
            ids = kv.alloc(n)
            if ids is None:  # a page could not be backed: evict more and try once more
                self.evict_lru(n)
                ids = kv.alloc(n)
        if ids is not None:
            ref = self.ref
            for b in ids:
                ref[b] = 1
        return ids

    def cache_full_blocks(self, blocks: Sequence[int], hashes: Sequence[int], start: int,
                          end: int, group_id: int = 0) -> None:
        """Register blocks ``start..end-1`` under their hashes (first writer keeps the key)."""
        if not self.enable_caching:
            return
        for i in range(start, end):
            b = blocks[i]
            key = (hashes[i], group_id)
            if b in self.key_of or key in self.cached:
                continue
            self.cached[key] = b
            self.key_of[b] = key

    def free_blocks(self, blocks: Iterable[int]) -> None:
        """Drop one reference each, in eviction order (pass a request's blocks tail first)."""
        ref, ev, drop = self.ref, self.evictable, []
        for b in blocks:
            if b == self.null_block:
                continue
            ref[b] -= 1
            if ref[b] < 0:
                raise ConfigError(f"free of block {b}", "its ref count went below 0",
                                  "free each block once per reference")
            if ref[b] == 0:
                if b in self.key_of:
                    ev[b] = None
                else:
                    drop.append(b)
        if drop:
            self.kv.free(drop)
        self.enforce_cap()

    # -- eviction ----------------------------------------------------------------------------
    def _uncache(self, blocks: list[int]) -> None:
        for b in blocks:
            del self.evictable[b]
            del self.cached[self.key_of.pop(b)]
        self.kv.free(blocks)

    def evict_lru(self, n: int) -> int:
        victims = []
        for b in self.evictable:
            if len(victims) >= n:
                break
            victims.append(b)
        if victims:
            self._uncache(victims)
            self.evicted_lru += len(victims)
        return len(victims)

    def occupancy(self, page: int) -> int:
        """Ledger-allocated blocks on ``page`` (cached ones count: they are still allocated)."""
        return self.kv.page_occupancy(page)

    def enforce_cap(self) -> int:
        cap = self.max_cached_blocks
        if cap < 0 or len(self.evictable) <= cap:
            return 0
        excess = len(self.evictable) - cap
        if not self.page_aware:
            n = self.evict_lru(excess)
            self.evicted_lru -= n
            self.evicted_cap += n
            return n
        victims = page_aware_victims(self.evictable, excess, self.geometry.block_page,
                                     self.occupancy)
        self._uncache(victims)
        self.evicted_cap += len(victims)
        return len(victims)

    def reset_prefix_cache(self) -> int:
        """Evict every cached block no request holds; returns how many."""
        n = len(self.evictable)
        if n:
            self._uncache(list(self.evictable))
        self.key_of = {b: k for b, k in self.key_of.items() if self.ref[b] > 0}
        self.cached = {k: b for b, k in self.key_of.items()}
        return n

    def check_invariants(self) -> None:
        from workbench.errors import StateConsistencyError

        for b in self.evictable:
            if self.ref[b] != 0 or b not in self.key_of:
                raise StateConsistencyError(f"evictable block {b} has ref {self.ref[b]}")
        for k, b in self.cached.items():
            if self.key_of.get(b) != k:
                raise StateConsistencyError(f"cache key of block {b} is inconsistent")
            if b not in self.kv.allocated:
                raise StateConsistencyError(f"cached block {b} is not allocated in the ledger")
        live = sum(1 for r in self.ref if r > 0)
        if live + len(self.evictable) != self.kv.used_blocks:
            raise StateConsistencyError(
                f"{live} referenced + {len(self.evictable)} evictable != "
                f"{self.kv.used_blocks} ledger blocks")
