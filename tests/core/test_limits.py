"""Memory limits: revision outcomes, the shrink state machine, and no page id issued twice."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.config import PoolConfig
from workbench.core.events import PageState
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.core.limits import LimitOutcome as O
from workbench.sim.device import SimDevice


def make(pages=10, min_r=0, max_r=2):
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16,
                     num_blocks=64 * pages)
    cfg = PoolConfig(min_reserved_pages=min_r, max_reserved_pages=max_r, gpu_utilization=1.0)
    return KVCacheManager(geo, SimDevice(), name="p", config=cfg)


def pages(kv, n):
    return n * kv.geometry.page_id_bytes


def test_revision_outcomes():
    kv = make()
    assert kv.set_limit(pages(kv, 8), revision=5).outcome is O.APPLIED
    assert kv.set_limit(pages(kv, 6), revision=4).outcome is O.STALE
    assert kv.set_limit(pages(kv, 6), revision=5).outcome is O.CONFLICT
    same = kv.set_limit(pages(kv, 8), revision=5)
    assert same.outcome is O.APPLIED and same.revision == 5
    assert kv.set_limit(-1).outcome is O.REJECTED
    assert kv.set_limit(pages(kv, 11)).outcome is O.REJECTED
    assert kv.set_limit(pages(kv, 1) - 1).outcome is O.REJECTED
    assert kv.limit_bytes == pages(kv, 8) and kv.revision == 5
    assert [e.dst for e in kv.events if e.page < 0] == [
        "applied", "stale", "conflict", "rejected", "rejected", "rejected"]


@pytest.mark.parametrize("limit, revision, reason", [
    (True, None, "limit True is not an int"),
    (2.0 * (1 << 20), None, "limit 2097152.0 is not an int"),
    ("64MiB", None, "limit '64MiB' is not an int"),
    (1 << 30, 2.0, "revision 2.0 is not an int in [0, 4611686018427387903]"),
    (1 << 30, True, "revision True is not an int in [0, 4611686018427387903]"),
    (1 << 30, -1, "revision -1 is not an int in [0, 4611686018427387903]"),
    (1 << 30, 1 << 63, "revision 9223372036854775808 is not an int in [0, 4611686018427387903]"),
])
def test_impossible_requests_are_rejected_and_change_nothing(limit, revision, reason):
    kv = make()
    kv.set_limit(pages(kv, 8), revision=5)
    r = kv.set_limit(limit, revision)
    assert (r.outcome, r.reason, r.limit, r.revision) == (O.REJECTED, reason, pages(kv, 8), 5)
    assert kv.limit_bytes == pages(kv, 8) and kv.revision == 5
    assert kv.events.events[-1].dst == "rejected"


def test_shrink_defers_never_revokes_and_converges():
    kv = make()
    live = [kv.alloc(63)] + [kv.alloc(64) for _ in range(6)]  # one page each; 0 has the null
    assert kv.pages.counts[PageState.IN_USE] == 7
    r = kv.set_limit(pages(kv, 3))
    assert r.outcome is O.DEFERRED and kv.pages.shrinking
    assert all(kv.allocated.issuperset(ids) for ids in live)  # nothing revoked
    assert kv.alloc(64) is None  # no new pages while shrinking
    for ids in live[3:]:  # frees on the tail (pages 3..6) give their pages back
        kv.free(ids)
    assert kv.limit_state.outcome is O.APPLIED
    assert kv.pages.mapped_pages <= 3
    assert all(s is PageState.RECLAIMED for s in kv.pages.state[3:])
    kv.check_invariants()


def test_new_allocations_avoid_the_retired_tail():
    kv = make()
    a, b, c = kv.alloc(63), kv.alloc(64), kv.alloc(10)  # page 0, page 1, page 2 (54 free)
    kv.free(a[:20])  # 20 free on page 0
    assert kv.set_limit(pages(kv, 2)).outcome is O.DEFERRED
    got = kv.alloc(5)
    assert got is not None and all(kv.geometry.block_page(x) == 0 for x in got)
    assert kv.alloc(30) is None  # page 2's free blocks are past the limit
    kv.free(a[20:] + b + c + got)
    assert kv.limit_state.outcome is O.APPLIED
    kv.check_invariants()


def test_grow_after_shrink_never_issues_a_page_twice():
    """kvcached: shrink 10 -> 5 pages, then a limit of 12 hands two page ids out twice."""
    kv = make(pages=12)
    assert kv.set_limit(pages(kv, 10)).outcome is O.APPLIED
    assert kv.set_limit(pages(kv, 5)).outcome is O.APPLIED
    assert kv.set_limit(pages(kv, 12)).outcome is O.APPLIED
    ids = kv.alloc(kv.available_size())
    assert ids is not None and len(set(ids)) == len(ids)
    in_use = [e.page for e in kv.events if e.dst == "in_use"]
    assert len(in_use) == len(set(in_use)) == 12
    kv.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 200)), min_size=1, max_size=12))
def test_any_limit_sequence_never_double_issues(steps):
    kv = make(pages=12)
    held = []
    for limit_pages, n in steps:
        kv.set_limit(pages(kv, limit_pages))
        ids = kv.alloc(n)
        if ids:
            held.append(ids)
        flat = [b for ids in held for b in ids]
        assert len(flat) == len(set(flat))
        counts = Counter(e.page for e in kv.events if e.dst == "in_use")
        live = [p for p, s in enumerate(kv.pages.state) if s is PageState.IN_USE]
        assert all(counts[p] >= 1 for p in live)
        kv.check_invariants()
        if len(held) > 3:
            kv.free(held.pop(0))
    for ids in held:
        kv.free(ids)
    assert kv.limit_state.outcome is O.APPLIED
