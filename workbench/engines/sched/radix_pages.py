"""Page-aware eviction for the radix cache (seed 001 §6): which cuts empty a whole VMM page at the
least cost, and, when live or locked blocks pin every page, which leaf tails to peel so that the
pages closest to empty are the ones that go. :class:`~workbench.engines.sched.radix_cache.
RadixCache` inherits these; they read its tree (``root``, ``_nodes``, ``_occupancy``,
``_evict_from``) and its ledger's geometry. The tree's :class:`Node` is defined here, below
both, so neither module imports the other's.
"""

from __future__ import annotations

import heapq
from collections import Counter


class Node:
    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access", "nid")

    def __init__(self, key: tuple[int, ...], value: list[int], parent: Node | None, nid: int):
        self.key = key
        self.value = value
        self.children: dict[object, Node] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0
        self.nid = nid


class PageAwareEviction:
    def _best_page_cut(self) -> list[tuple[Node, int]] | None:
        """The cuts (node, first block index) that empty the best emptiable VMM page, or None.

        A block can only go with the rest of its node and its subtree (a prefix cannot outlive
        its parent), so emptying a page costs blocks on other pages too; that collateral may
        empty further pages. Score: blocks lost per page emptied, then blocks lost, then age.
        """
        g = self.geometry
        order = [n for n in self._nodes() if n.lock_ref == 0 and n is not self.root]
        below: dict[Node, Counter[int]] = {}  # pages of the blocks in a node's children
        whole: dict[Node, Counter[int]] = {}
        for n in reversed(order):  # children come after parents in _nodes order
            c: Counter[int] = Counter()
            for ch in n.children.values():
                c.update(whole[ch])
            below[n] = c
            whole[n] = c + Counter(g.block_page(b) for b in n.value)
        on_page: dict[int, dict[Node, int]] = {}  # page -> node -> first index on the page
        count: Counter[int] = Counter()
        for n in order:
            for j, b in enumerate(n.value):
                p = g.block_page(b)
                count[p] += 1
                on_page.setdefault(p, {}).setdefault(n, j)
        best = None
        for page, first in on_page.items():
            if self._occupancy(page) != count[page]:
                continue  # a live block or a locked node pins this page
            cuts = [(n, j) for n, j in first.items() if not self._has_ancestor_in(n, first)]
            gone: Counter[int] = Counter()
            for n, j in cuts:
                gone.update(below[n])
                gone.update(g.block_page(b) for b in n.value[j:])
            lost = sum(gone.values())
            emptied = sum(1 for q, k in gone.items() if k == self._occupancy(q))
            key = (lost / emptied, lost, min(n.last_access for n, _ in cuts), page)
            if best is None or key < best[0]:
                best = (key, cuts)
        return None if best is None else best[1]

    def _has_ancestor_in(self, node: Node, nodes: dict[Node, int]) -> bool:
        a = node.parent
        while a is not None and a is not self.root:
            if a in nodes:
                return True
            a = a.parent
        return False

    def _peel(self, blocks: int) -> int:
        """Evict ``blocks`` tail blocks of unlocked leaves, emptiest VMM page first (LRU within).

        Used when no page can be emptied now (live or locked blocks pin them): the holes go to
        the pages closest to empty, not everywhere, so those pages empty when their requests end.
        """
        g, page = self.geometry, self.page
        occ: dict[int, int] = {}
        tails: dict[int, list[Node]] = {}  # page -> unlocked leaves whose last block is on it
        heap: list[tuple[int, int]] = []

        def add(leaf: Node) -> None:
            q = g.block_page(leaf.value[-1])
            if q not in occ:
                occ[q] = self._occupancy(q)
            if q not in tails:
                tails[q] = []
                heapq.heappush(heap, (occ[q], q))
            tails[q].append(leaf)

        for n in self._nodes():
            if n is not self.root and not n.children and n.lock_ref == 0:
                add(n)
        out: list[int] = []
        while heap and len(out) < blocks:
            _, p = heapq.heappop(heap)
            leaves = tails.pop(p, None)
            if not leaves:
                continue
            leaves.sort(key=lambda n: (n.last_access, n.nid), reverse=True)  # oldest last
            while leaves and len(out) < blocks:
                leaf = leaves[-1]
                ck = self._child_key(leaf.key, 0)
                out.append(leaf.value.pop())
                del self.owner[out[-1]]
                leaf.key = leaf.key[:-page]
                self.evictable_size -= page
                occ[p] -= 1
                if leaf.value and g.block_page(leaf.value[-1]) == p:
                    continue
                leaves.pop()
                if leaf.value:
                    add(leaf)
                    continue
                parent = leaf.parent
                del parent.children[ck]
                if parent is not self.root and not parent.children and parent.lock_ref == 0:
                    if g.block_page(parent.value[-1]) == p:
                        leaves.append(parent)
                        leaves.sort(key=lambda n: (n.last_access, n.nid), reverse=True)
                    else:
                        add(parent)
            if leaves:
                tails[p] = leaves
                heapq.heappush(heap, (occ[p], p))
        if out:
            self.kv.free(out)
        return len(out) * page
