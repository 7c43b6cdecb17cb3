"""Reading the block ledger without changing it: its snapshot, the check of the ids a caller hands
to ``free``, and the invariants tests assert.

``free`` takes a fast path when every id is a plain ``int``, distinct and allocated; anything else
comes here, which either names the first bad id (nothing in the ledger touched yet) or returns
the ids as plain ints (an integer type such as numpy's ``int64`` is accepted by value).
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass, field
from typing import Protocol

from workbench.core.blockset import BlockSet
from workbench.core.events import PageState
from workbench.core.geometry import KVGeometry
from workbench.core.pages import PageAllocator
from workbench.core.vspace import KVSpace
from workbench.errors import ConfigError, StateConsistencyError


class LedgerView(Protocol):
    """What these readers read of a :class:`~workbench.core.ledger.KVCacheManager` (named here,
    so the ledger imports this module and not the other way round)."""

    name: str
    geometry: KVGeometry
    pages: PageAllocator
    space: KVSpace
    allocated: BlockSet
    free_blocks: dict[int, list[int]]
    reserved_blocks: list[int]
    num_free: int
    null_block: int | None


@dataclass(slots=True)
class PoolSnapshot:
    name: str
    page_id_bytes: int
    num_pages: int
    block_size: int
    used_blocks: int
    available_blocks: int
    counts: dict[str, int]
    limit_bytes: int
    limit_pages: int
    revision: int
    shrinking: bool
    failed: str | None
    misses: int
    page_states: list[str] = field(default_factory=list)

    @property
    def mapped_bytes(self) -> int:
        c = self.counts
        return (c["in_use"] + c["reserved"] + c["retired"]) * self.page_id_bytes

    @property
    def reserved_bytes(self) -> int:
        return self.counts["reserved"] * self.page_id_bytes


def checked_free_ids(kv: LedgerView, ids: object) -> list[int]:
    """The ids of a ``free(ids)`` call as plain ints, or a ConfigError naming the first bad one:
    not a list of ids, not an integer (a float such as 2.0 or a bool is refused), outside the
    pool, the null block, not allocated, listed twice, or held in the pool's reserve."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise ConfigError(f"free({_short(ids)})", "needs an iterable of block ids",
                          "pass the list of ids alloc returned")
    out: list[int] = []
    seen: set[int] = set()
    held = set(kv.reserved_blocks)
    for b in ids:
        if isinstance(b, bool) or not isinstance(b, numbers.Integral):
            raise ConfigError(f"free of block {_short(b)}", "a block id is an int",
                              "free the ids alloc gave, unchanged")
        b = operator.index(b)
        if not 0 <= b < kv.geometry.num_blocks:
            raise ConfigError(f"free of block {b}", f"not a block id of pool {kv.name!r}",
                              "free the ids alloc gave")
        if b == kv.null_block:
            raise ConfigError("free of block 0", "the null block is never freed",
                              "drop block 0 from the list")
        if b not in kv.allocated or b in seen:
            raise ConfigError(f"free of block {b}", "it is not allocated (double free?)",
                              "free each id once, after alloc returned it")
        if b in held:
            raise ConfigError(f"free of block {b}", "it is held in the pool's reserve "
                              "(try_to_reserve), not handed out", "give the reserve back with "
                              "free_reserved(), or alloc it first")
        seen.add(b)
        out.append(b)
    return out


def _short(x: object) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:36] + "..."


def check_invariants(kv: LedgerView) -> None:
    """Raise StateConsistencyError if the ledger and the page states disagree (tests use it)."""
    p, g = kv.pages, kv.geometry
    if sum(p.counts.values()) != p.num_pages:
        raise StateConsistencyError(f"page counts {p.counts} do not add up to {p.num_pages}")
    for page, st in enumerate(p.state):
        mapped = kv.space.is_mapped(page)
        live = st in (PageState.IN_USE, PageState.RESERVED, PageState.RETIRED)
        if live != mapped and st is not PageState.QUARANTINED:
            raise StateConsistencyError(f"page {page} is {st.value} but mapped={mapped}")
        if (st is PageState.IN_USE) != (page in kv.free_blocks):
            raise StateConsistencyError(f"page {page} is {st.value} in the ledger's view")
    owned = kv.allocated | set(kv.reserved_blocks)
    if any(type(b) is not int for b in owned):
        raise StateConsistencyError("an owned block id is not a plain int")
    for page, stack in kv.free_blocks.items():
        blocks = set(g.page_blocks(page))
        if len(set(stack)) != len(stack) or not set(stack) <= blocks or set(stack) & owned:
            raise StateConsistencyError(f"page {page}: free list {stack} is inconsistent")
        if set(stack) | (owned & blocks) != blocks:
            raise StateConsistencyError(f"page {page}: a block is neither free nor owned")
    for b in owned:
        if p.state[g.block_page(b)] is not PageState.IN_USE:
            raise StateConsistencyError(f"block {b} is owned on a page that is not in use")
    if kv.num_free != sum(len(s) for q, s in kv.free_blocks.items() if q < p.limit_pages):
        raise StateConsistencyError("num_free drifted from the free lists")
    if len(set(p.reserved)) != len(p.reserved) or any(
            p.state[q] is not PageState.RESERVED for q in p.reserved):
        raise StateConsistencyError(f"reserve list {p.reserved} is inconsistent")
