"""SGLang's promise under a shrinking limit: it admits work when ``available_size()`` plus its
radix cache's evictable tokens cover it, evicts, then allocates and raises on a miss (seen on the
H200: a ``kvctl limit`` mid-run crashed SGLang 0.5.16's scheduler with "Out of memory ... Available
tokens: 4674 (available_size=2882 + evictable_size=1792)" for 3840). Blocks freed while the pool
shrinks are held back for that allocation (``adapters/sglang/slots.py``); these tests drive the
allocator's engine-free part over a real host ledger."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.adapters.runtime import make_ledger
from workbench.adapters.sglang.slots import LedgerSlots
from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.errors import ConfigError
from workbench.viz.scenarios import small_geometry

PAGES = 6

@pytest.fixture(scope="module")
def host():
    return make_device("host")

def slots_over(host) -> tuple[LedgerSlots, int]:
    geo = small_geometry(num_pages=PAGES)
    kv = make_ledger(geo, host, "sgl-held", PoolConfig(min_reserved_pages=0, max_reserved_pages=0))
    return LedgerSlots.over(kv), geo.num_blocks // PAGES

def ids(t) -> list[int]:
    return [int(x) for x in t.tolist()]

def test_evicted_tokens_on_the_retiring_tail_come_back_to_the_allocation(host):
    s, per = slots_over(host)
    kv = s.ledger
    live = ids(s.alloc_slots(per))  # a running request, first page
    cached = ids(s.alloc_slots(3 * per))  # finished requests the radix cache keeps
    kv.set_limit(2 * kv.geometry.page_id_bytes)  # mapped 4 page ids: the tail is in use
    assert kv.pages.shrinking
    mapped = kv.mapped_bytes
    available = s._room()  # what SGLang's admission reads
    evict = cached[-2 * per:]  # LRU leaves: two whole pages of the retiring tail
    assert available + len(evict) >= 2 * per  # SGLang admits 2 pages' worth
    s.free_slots(torch.tensor(evict))
    got = s.alloc_slots(2 * per)
    assert got is not None, "the allocation SGLang was promised missed"
    got = ids(got)
    assert len(set(got)) == len(got) and not set(got) & set(live + cached[:-2 * per])
    assert s.held_back == [] and kv.mapped_bytes <= mapped  # nothing mapped for it
    s.free_slots(torch.tensor(got + cached[:-2 * per]))
    s._room()
    assert kv.mapped_bytes <= 2 * kv.geometry.page_id_bytes  # the limit converged
    kv.check_invariants()
    s.free_slots(torch.tensor(live))
    kv.close()

def test_a_double_free_while_held_is_refused(host):

    s, per = slots_over(host)
    kv = s.ledger
    a = ids(s.alloc_slots(3 * per))
    kv.set_limit(kv.geometry.page_id_bytes)
    s.free_slots(torch.tensor(a[:4]))
    with pytest.raises(ConfigError, match="double free"):
        s.free_slots(torch.tensor(a[2:6]))
    with pytest.raises(ConfigError, match="not allocated"):
        s.free_slots(torch.tensor([kv.geometry.num_blocks - 1]))
    assert s.held_back == a[:4]
    s._room()
    assert s.held_back == [] and s.unheld_size() == s.size - len(a[4:])
    kv.close()

@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["req", "finish", "limit", "step"]),
                          st.integers(1, 40), st.integers(0, 6)), min_size=1, max_size=40))
def test_promise_kept_no_id_twice_no_growth_while_shrinking(host, ops):

    s, per = slots_over(host)
    kv = s.ledger
    running: list[list[int]] = []
    cached: list[int] = []
    for op, n, k in ops:
        if op == "req":  # admission as SGLang does it: available + evictable, evict, allocate
            available = s._room()
            if n > available + len(cached):
                continue
            mapped_before = kv.mapped_bytes
            shrinking = kv.pages.shrinking
            if n > available:
                s.free_slots(torch.tensor(cached[:n]))
                del cached[:n]
            got = s.alloc_slots(n)
            assert got is not None, (n, available)
            got = ids(got)
            if shrinking:
                assert kv.mapped_bytes <= mapped_before
            held = [b for r in running for b in r] + cached
            assert len(set(got)) == n and not set(got) & set(held)
            running.append(got)
        elif op == "finish" and running:  # a request ends: its tokens stay cached
            cached += running.pop(k % len(running))
        elif op == "limit":
            kv.set_limit(max(1, k) * kv.geometry.page_id_bytes)
        elif op == "step" and cached:  # the radix cache bound evicts a few
            s.free_slots(torch.tensor(cached[:n]))
            del cached[:n]
        assert not set(s.held_back) & {b for r in running for b in r}
        assert kv.used_blocks - len(s.held_back) == sum(map(len, running)) + len(cached)
    kv.check_invariants()
    kv.close()
