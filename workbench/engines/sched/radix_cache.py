"""SGLang-style prefix ownership: a radix tree over token ids (seed 001 §6).

Each node's key is a run of tokens and its value the KV pages (SGLang pages = ledger blocks of
``page_tokens`` token slots) that hold them; ``page_tokens = 1`` is token-granular reuse, larger
pages make every key page-aligned. A request *locks* the path it matched (``lock_ref`` climbs to
the root), so a locked node is never evicted; everything else counts in ``evictable_size``
(tokens). A node with ``lock_ref == 0`` has an unlocked subtree, so it can go together with it.

Eviction: over the cached-token bound it is page-aware: it empties whole VMM pages first, each
choice re-scored by cached blocks lost per page emptied (a cut takes its node's tail and subtree,
which may empty other pages too); when live or locked blocks pin every page, it peels leaf tails
off the emptiest pages. On an allocation shortage it is LRU over unlocked leaves.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from workbench.core.ledger import KVCacheManager
from workbench.engines.sched.eviction import cap_blocks
from workbench.engines.sched.radix_pages import Node, PageAwareEviction
from workbench.errors import ConfigError, StateConsistencyError


class RadixCache(PageAwareEviction):
    def __init__(self, kv: KVCacheManager, *, enable_caching: bool = True,
                 max_cached_tokens: int | None = None, page_aware: bool = True):
        self.kv = kv
        self.page_aware = page_aware  # False: the cap evicts LRU leaves too
        self.geometry = kv.geometry
        self.page = kv.geometry.block_size  # tokens per SGLang page (ledger block)
        self.enable_caching = enable_caching
        tokens = kv.config.max_cached_tokens if max_cached_tokens is None else max_cached_tokens
        blocks = cap_blocks(tokens, self.page)
        self.max_cached_tokens = -1 if blocks < 0 else blocks * self.page
        self._nid = 0
        self._tick = 0
        self.root = Node((), [], None, self._next_id())
        self.root.lock_ref = 1  # the root is never evicted
        self.owner: dict[int, Node] = {}  # block -> node holding it
        self.evictable_size = 0  # tokens in nodes with lock_ref == 0
        self.protected_size = 0  # tokens in locked nodes
        self.queries = 0
        self.hit_tokens = 0
        self.evicted_cap = 0
        self.evicted_lru = 0

    def _next_id(self) -> int:
        self._nid += 1
        return self._nid

    def _touch(self, node: Node) -> None:
        self._tick += 1
        node.last_access = self._tick

    def _child_key(self, tokens: Sequence[int], i: int) -> object:
        return tokens[i] if self.page == 1 else tuple(tokens[i:i + self.page])

    # -- lookup ------------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int]) -> tuple[list[int], Node]:
        """Blocks of the longest cached page-aligned prefix of ``tokens`` and its last node."""
        self.queries += 1
        if not self.enable_caching:
            return [], self.root
        out, node = self._match(tokens)
        self.hit_tokens += len(out) * self.page
        return out, node

    def _match(self, tokens: Sequence[int]) -> tuple[list[int], Node]:
        n = len(tokens) - len(tokens) % self.page
        node, i, out = self.root, 0, []
        self._touch(node)
        while i < n:
            child = node.children.get(self._child_key(tokens, i))
            if child is None:
                break
            k = self._common(child.key, tokens, i, n)
            if k < len(child.key):
                child = self._split(child, k)
            out.extend(child.value)
            self._touch(child)
            node, i = child, i + k
            if k == 0:
                break
        return out, node

    def _common(self, key: tuple[int, ...], tokens: Sequence[int], i: int, n: int) -> int:
        m = min(len(key), n - i)
        k = 0
        while k < m and key[k] == tokens[i + k]:
            k += 1
        return k - k % self.page

    def _split(self, child: Node, k: int) -> Node:
        """Cut ``child`` after ``k`` tokens; returns the new upper node."""
        upper = Node(child.key[:k], child.value[:k // self.page], child.parent, self._next_id())
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        child.parent.children[self._child_key(child.key, 0)] = upper
        child.key = child.key[k:]
        child.value = child.value[k // self.page:]
        child.parent = upper
        upper.children[self._child_key(child.key, 0)] = child
        for b in upper.value:
            self.owner[b] = upper
        return upper

    # -- insert ------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> int:
        """Add ``tokens`` (page-aligned, len == len(blocks) * page) backed by ``blocks``.

        Returns how many leading tokens were already cached: the caller owns (and must free) its
        blocks for that range unless they are the very blocks the tree holds.
        """
        if not self.enable_caching:
            return 0
        n = len(blocks) * self.page
        node, i = self.root, 0
        self._touch(node)
        while i < n:
            key = self._child_key(tokens, i)
            child = node.children.get(key)
            if child is None:
                leaf = Node(tuple(tokens[i:n]), list(blocks[i // self.page:]), node,
                            self._next_id())
                node.children[key] = leaf
                for b in leaf.value:
                    self.owner[b] = leaf
                self.evictable_size += n - i
                self._touch(leaf)
                return i
            k = self._common(child.key, tokens, i, n)
            if k < len(child.key):
                child = self._split(child, k)
            self._touch(child)
            node, i = child, i + k
        return i

    def cache_unfinished(self, tokens: Sequence[int], blocks: list[int],
                         node: Node) -> tuple[list[int], Node]:
        """SGLang's ``cache_unfinished_req``: put a running request's computed KV in the tree so
        others can match it while it still decodes.

        ``blocks`` back ``tokens`` (page-aligned); ``node`` is the request's locked node. Blocks
        that duplicate what the tree already held are freed. Returns the request's blocks for
        that range (now the tree's) and its new locked node; the old lock is dropped.
        """
        if not self.enable_caching or not blocks:
            return blocks, node
        prefix = self.insert(tokens, blocks)
        dup = [b for b in blocks[:prefix // self.page] if self.owner.get(b) is None]
        new_blocks, new_node = self._match(tokens)
        self.inc_lock_ref(new_node)
        self.dec_lock_ref(node)
        self.free(dup)
        return new_blocks, new_node

    # -- locks -------------------------------------------------------------------------------
    def inc_lock_ref(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            if node.lock_ref < 0:
                raise StateConsistencyError(f"radix node {node.nid} unlocked below 0")
            node = node.parent

    # -- allocation through the ledger -------------------------------------------------------
    def available_blocks(self) -> int:
        return self.kv.available_size() + self.evictable_size // self.page

    def alloc(self, n: int) -> list[int] | None:
        """n KV pages from the ledger, evicting LRU leaves on a shortage; None on a miss."""
        if n == 0:
            return []
        short = n - self.kv.available_size()
        if short > 0:
            self.evict(short * self.page)
        ids = self.kv.alloc(n)
        if ids is None and self.evictable_size:
            self.evict(n * self.page)
            ids = self.kv.alloc(n)
        return ids

    def free(self, blocks: Sequence[int]) -> None:
        if blocks:
            self.kv.free(blocks)

    # -- eviction ----------------------------------------------------------------------------
    def _remove_leaf(self, node: Node) -> None:
        parent = node.parent
        del parent.children[self._child_key(node.key, 0)]
        for b in node.value:
            del self.owner[b]
        self.evictable_size -= len(node.key)
        self.kv.free(node.value)

    def evict(self, num_tokens: int) -> int:
        """LRU over unlocked leaves until ``num_tokens`` are freed; returns tokens freed."""
        heap = [(n.last_access, n.nid, n) for n in self._nodes() if not n.children
                and n.lock_ref == 0 and n is not self.root]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            _, _, node = heapq.heappop(heap)
            self._remove_leaf(node)
            freed += len(node.key)
            p = node.parent
            if p is not self.root and not p.children and p.lock_ref == 0:
                heapq.heappush(heap, (p.last_access, p.nid, p))
        self.evicted_lru += freed
        return freed

    def enforce_cap(self) -> int:
        cap = self.max_cached_tokens
        if cap < 0 or self.evictable_size <= cap:
            return 0
        if not self.page_aware:
            n = self.evict(self.evictable_size - cap)
            self.evicted_lru -= n
            self.evicted_cap += n
            return n
        freed = 0
        while self.evictable_size > cap:  # whole pages first, re-scored after every cut
            cut = self._best_page_cut()
            if cut is None:
                break
            for node, j in cut:
                freed += self._evict_from(node, j)
        if self.evictable_size > cap:  # pinned pages: drain the emptiest ones block by block
            freed += self._peel(-(-(self.evictable_size - cap) // self.page))
        self.evicted_cap += freed
        return freed

    def _evict_from(self, node: Node, j: int) -> int:
        """Drop ``node``'s blocks from index ``j`` on, and its whole subtree."""
        if j > 0:
            self._split(node, j * self.page)  # ``node`` keeps the lower part after the split
        return self._remove_subtree(node)

    def _remove_subtree(self, top: Node) -> int:
        stack, order = [top], []
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        freed = 0
        for n in reversed(order):  # leaves first, so each removal is a leaf removal
            freed += len(n.key)
            self._remove_leaf(n)
        return freed

    def _occupancy(self, page: int) -> int:
        return self.kv.page_occupancy(page)

    def reset(self) -> int:
        return self.evict(self.evictable_size)

    # -- observation -------------------------------------------------------------------------
    def _nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    @property
    def cached_tokens(self) -> int:
        return self.evictable_size + self.protected_size

    def check_invariants(self) -> None:
        ev = prot = 0
        for n in self._nodes():
            if n is self.root:
                continue
            if len(n.key) != len(n.value) * self.page:
                raise StateConsistencyError(f"node {n.nid}: key/value lengths disagree")
            if n.lock_ref < 0 or (n.lock_ref == 0 and any(c.lock_ref for c in
                                                           n.children.values())):
                raise StateConsistencyError(f"node {n.nid}: a locked child under an unlocked node")
            if n.lock_ref:
                prot += len(n.key)
            else:
                ev += len(n.key)
            for b in n.value:
                if self.owner.get(b) is not n or b not in self.kv.allocated:
                    raise StateConsistencyError(f"block {b} of node {n.nid} is not owned/allocated")
        if (ev, prot) != (self.evictable_size, self.protected_size):
            raise StateConsistencyError(f"sizes {self.evictable_size}/{self.protected_size} != "
                                        f"{ev}/{prot}")
        if not self.enable_caching and len(self.root.children):
            raise ConfigError("radix cache", "holds nodes with caching off", "report a bug")
