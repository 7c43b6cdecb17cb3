"""Hypothesis stateful tests of the block ledger and page allocator invariants.

Several pools share one small simulated GPU; hypothesis drives allocs, frees, limits, trims,
refills and injected device failures, and after every step checks:

* page counts add up, no page is both free and mapped, the ledger agrees with the page states;
* no block is owned twice, and every alloc is all-or-nothing (a miss changes no block);
* the event chain is consistent: every event's ``src`` is the page's last ``dst`` (so no page id
  is ever issued twice, and nothing changes state behind the trace's back);
* once every block is freed, a pending limit has converged and mapped pages fit the limit.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from workbench.config import PoolConfig
from workbench.core.device import FaultyDevice
from workbench.core.events import Event, PageState
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.core.limits import LimitOutcome
from workbench.errors import ConfigError, PoolClosedError, PoolFailedError, StateConsistencyError
from workbench.sim.device import MiB, SimDevice

POOLS = ("a", "b")


class ChainChecker:
    """Follows the event stream and checks each transition starts where the last one ended."""

    def __init__(self) -> None:
        self.state: dict[tuple[str, int], str] = {}
        self.errors: list[str] = []

    def __call__(self, e: Event) -> None:
        if e.page < 0:
            return
        key = (e.pool, e.page)
        last = self.state.get(key, PageState.FREE.value)
        if e.src != last:
            self.errors.append(f"{e}: page was {last}")
        self.state[key] = e.dst


class LedgerMachine(RuleBasedStateMachine):
    allocations = Bundle("allocations")

    @initialize(layout=st.sampled_from(list(Layout)), block_size=st.sampled_from([16, 48]),
                min_r=st.integers(0, 2), max_extra=st.integers(0, 2))
    def setup(self, layout, block_size, min_r, max_extra):
        # 24 MiB per page id (4 layers x 2 buffers x... ) on a 12-page-id device: pools contend
        self.device = FaultyDevice(SimDevice("h200", capacity=96 * MiB))
        self.chain = ChainChecker()
        self.pools: dict[str, KVCacheManager] = {}
        for name in POOLS:
            geo = KVGeometry(num_layers=2, kv_heads=4, head_dim=128, block_size=block_size,
                             num_blocks=300, layout=layout)
            cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS,
                             min_reserved_pages=min_r, max_reserved_pages=min_r + max_extra,
                             gpu_utilization=1.0)
            pool = KVCacheManager(geo, self.device, name=name, config=cfg)
            pool.events.subscribe(self.chain)
            for e in pool.events:  # events emitted during construction
                self.chain(e)
            self.pools[name] = pool
        self.owned: dict[str, set[int]] = {n: set() for n in POOLS}

    def _healthy(self, name: str) -> bool:
        return self.pools[name].pages.failed is None

    def _run(self, name: str, fn, *args):
        """Run one pool op; a StateConsistencyError is allowed only if it failed the pool."""
        try:
            return fn(*args)
        except StateConsistencyError:
            assert self.pools[name].pages.failed, "consistency error without a failed pool"
            return "failed"

    @rule(target=allocations, name=st.sampled_from(POOLS), n=st.integers(0, 120))
    def alloc(self, name, n):
        pool = self.pools[name]
        if not self._healthy(name):
            return None
        before = set(pool.allocated)
        avail = pool.available_size()
        ids = self._run(name, pool.alloc, n)
        if ids == "failed":
            return None
        if ids is None:
            assert set(pool.allocated) == before, "a miss changed the ledger"
            return None
        assert len(ids) == n and len(set(ids)) == n
        assert n <= avail
        assert not set(ids) & self.owned[name], "a block was issued twice"
        self.owned[name] |= set(ids)
        return (name, ids)

    @rule(name=st.sampled_from(POOLS), data=st.data())
    def hostile_free(self, name, data):
        """A free with any bad id (a float or bool twin of an owned id, out of range, unowned,
        listed twice, the null block, one the pool's reserve holds) is refused whole, and the
        ledger is exactly as before."""
        pool = self.pools[name]
        if not self._healthy(name):
            return
        owned = sorted(self.owned[name])
        n = pool.geometry.num_blocks
        twin = st.sampled_from(owned) if owned else st.just(1)
        bad = data.draw(st.one_of(
            twin.map(float), twin.map(lambda b: b == 1), st.integers(n, n + 5),
            st.integers(-5, -1), st.just(0), st.just("1"), st.none(),
            st.integers(1, n - 1).filter(lambda b: b not in self.owned[name]),
            twin.map(lambda b: [b]),
            st.sampled_from(pool.reserved_blocks or [0])))  # held by the pool, not handed out
        ids = data.draw(st.permutations(owned[:3] + [bad]))
        if len(owned) and data.draw(st.booleans()):
            ids = [owned[0], owned[0]]  # a duplicate instead
        before = (set(pool.allocated), {p: list(s) for p, s in pool.free_blocks.items()},
                  pool.num_free, pool.pages.counts.copy(), list(pool.reserved_blocks))
        try:
            pool.free(ids)
        except ConfigError:
            pass
        else:
            raise AssertionError(f"free({ids!r}) was accepted")
        assert before == (set(pool.allocated), {p: list(s) for p, s in pool.free_blocks.items()},
                          pool.num_free, pool.pages.counts.copy(), list(pool.reserved_blocks))

    @rule(name=st.sampled_from(POOLS), n=st.integers(1, 80))
    def reserve(self, name, n):
        """SGLang's try_to_reserve: blocks the pool holds for its next allocs. They are nobody's
        to free (hostile_free may pick them as unowned ids: refused); alloc hands them out."""
        pool = self.pools[name]
        if not self._healthy(name):
            return
        held = set(pool.reserved_blocks)
        if self._run(name, pool.try_to_reserve, n) is True:
            # its alloc takes held blocks first: the reserve ends holding at least n
            assert held <= set(pool.reserved_blocks)
            assert len(pool.reserved_blocks) == max(len(held), n)
            assert not set(pool.reserved_blocks) & self.owned[name]

    @rule(entry=consumes(allocations))
    def free(self, entry):
        if entry is None or not self._healthy(entry[0]):
            return
        name, ids = entry
        if not set(ids) <= self.owned[name]:  # already freed by free_everything_converges
            return
        self._run(name, self.pools[name].free, ids)
        self.owned[name] -= set(ids)

    @rule(name=st.sampled_from(POOLS), pages=st.integers(-1, 20),
          rev=st.one_of(st.none(), st.integers(0, 8)))
    def limit(self, name, pages, rev):
        pool = self.pools[name]
        if not self._healthy(name):
            return
        limit = pages * pool.geometry.page_id_bytes
        r = self._run(name, pool.set_limit, limit, rev)
        if r == "failed":
            return
        if pages < 1 or limit > pool.capacity_bytes:
            assert r.outcome in (LimitOutcome.REJECTED, LimitOutcome.STALE,
                                 LimitOutcome.CONFLICT, LimitOutcome.APPLIED)
        if r.outcome is LimitOutcome.DEFERRED:
            assert pool.pages.shrinking

    @rule(name=st.sampled_from(POOLS))
    def trim(self, name):
        if self._healthy(name):
            self._run(name, self.pools[name].trim)

    @rule(name=st.sampled_from(POOLS))
    def refill(self, name):
        if self._healthy(name):
            self._run(name, self.pools[name].pages.refill)

    @rule(call=st.sampled_from(["create", "map", "set_access", "unmap", "release"]),
          k=st.integers(1, 3))
    def inject(self, call, k):
        self.device.fail_next(call, k)

    @precondition(lambda self: all(p.pages.failed is None for p in self.pools.values()))
    @rule()
    def free_everything_converges(self):
        self.device.plan.clear()  # no more faults: the limits must now converge
        for name, pool in self.pools.items():
            if self.owned[name]:
                pool.free(sorted(self.owned[name]))
                self.owned[name].clear()
            pool.free_reserved()
            pool.trim()  # retries unmaps that failed while faults were injected
            assert pool.used_blocks == 0
            assert not pool.pages.shrinking
            assert pool.limit_state.outcome is LimitOutcome.APPLIED
            assert pool.pages.mapped_pages <= pool.pages.limit_pages

    @invariant()
    def consistent(self):
        if not hasattr(self, "pools"):
            return
        assert not self.chain.errors, self.chain.errors[:3]
        for name, pool in self.pools.items():
            if pool.pages.failed is None:
                pool.check_invariants()
                # the pool's reserve is allocated too, and disjoint from what callers own
                held = set(pool.reserved_blocks)
                assert not held & self.owned[name]
                assert pool.allocated - {0} == self.owned[name] | held
            else:  # a failed pool refuses work, loudly
                try:
                    pool.alloc(1)
                except PoolFailedError:
                    pass
                else:
                    raise AssertionError("a failed pool accepted an alloc")
        live = {h for p in self.pools.values()
                for hs in (*p.space.handles.values(), *p.space.retained.values()) for h in hs}
        device_handles = set(self.device.inner.allocations)
        assert live <= device_handles, "a pool holds a handle the device released"
        if not any(p.pages.counts[PageState.QUARANTINED] or p.pages.failed
                   for p in self.pools.values()):
            assert device_handles == live, "physical memory leaked"


LedgerMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestLedgerMachine = LedgerMachine.TestCase


def test_state_consistency_error_is_typed():
    assert issubclass(PoolFailedError, StateConsistencyError)


def _pool(**cfg) -> KVCacheManager:
    geo = KVGeometry(num_layers=2, kv_heads=4, head_dim=128, block_size=16, num_blocks=300)
    return KVCacheManager(geo, SimDevice("h200"), name="p1",
                          config=PoolConfig(min_reserved_pages=1, max_reserved_pages=2, **cfg))


@pytest.mark.parametrize("call, args", [
    ("alloc", (1,)), ("free", ([1],)), ("set_limit", (1 << 30,)), ("trim", ()), ("refill", ()),
    ("try_to_reserve", (1,)), ("free_reserved", ()), ("capture_marker", ()),
    ("release_retired_through", (0,)),
])
def test_every_call_on_a_closed_pool_is_refused(call, args):
    kv = _pool()
    kv.alloc(3)
    assert kv.close() == []
    with pytest.raises(PoolClosedError) as err:
        getattr(kv, call)(*args)
    assert str(err.value) == ("pool p1 is closed: close() gave its pages and reservation back. "
                              "Fix: build a new pool, or drop the call")
    assert kv.close() == [] and kv.snapshot().name == "p1"  # idempotent, still observable


@pytest.mark.parametrize("ids, message", [
    ([2.0], "free of block 2.0: a block id is an int. Fix: free the ids alloc gave, unchanged"),
    ([True], "free of block True: a block id is an int. Fix: free the ids alloc gave, unchanged"),
    ([1, 1], "free of block 1: it is not allocated (double free?). Fix: free each id once, "
             "after alloc returned it"),
    ([300], "free of block 300: not a block id of pool 'p1'. Fix: free the ids alloc gave"),
    ([0], "free of block 0: the null block is never freed. Fix: drop block 0 from the list"),
    ([[1]], "free of block [1]: a block id is an int. Fix: free the ids alloc gave, unchanged"),
    (5, "free(5): needs an iterable of block ids. Fix: pass the list of ids alloc returned"),
    ("12", "free('12'): needs an iterable of block ids. Fix: pass the list of ids alloc returned"),
])
def test_free_checks_every_id_before_touching_the_ledger(ids, message):
    kv = _pool()
    got = kv.alloc(4)
    before = (set(kv.allocated), {p: list(s) for p, s in kv.free_blocks.items()}, kv.num_free)
    with pytest.raises(ConfigError) as err:
        kv.free(ids)
    assert str(err.value) == message
    assert before == (set(kv.allocated), {p: list(s) for p, s in kv.free_blocks.items()},
                      kv.num_free)
    kv.free(got)  # the valid free still works, and leaves only plain ints behind
    kv.check_invariants()
    assert kv.used_blocks == 0
    kv.close()


@pytest.mark.parametrize("part", ["whole", "some"])
def test_free_refuses_ids_held_in_the_reserve(part):
    """try_to_reserve's blocks are allocated but the pool's own: free() of them would leave the
    reserve handing out freed ids. Refused, nothing changed; free_reserved gives them back."""
    geo = KVGeometry(num_layers=2, kv_heads=2, head_dim=64, block_size=16, num_blocks=8192)
    kv = KVCacheManager(geo, SimDevice("h200"), name="p1", config=PoolConfig(
        prealloc=False, min_reserved_pages=0, max_reserved_pages=0))
    bpp = geo.page_size // geo.block_bytes
    filler = kv.alloc(bpp - 1)  # the rest of the null block's page
    assert kv.try_to_reserve(bpp)  # one whole page, the shape the whole-page free takes
    held = list(kv.reserved_blocks)
    ids = held if part == "whole" else held[3:5]
    before = (set(kv.allocated), list(kv.reserved_blocks), kv.pages.mapped_pages)
    with pytest.raises(ConfigError) as err:
        kv.free(ids)
    assert str(err.value) == (f"free of block {ids[0]}: it is held in the pool's reserve "
                              "(try_to_reserve), not handed out. Fix: give the reserve back "
                              "with free_reserved(), or alloc it first")
    assert before == (set(kv.allocated), list(kv.reserved_blocks), kv.pages.mapped_pages)
    got = kv.alloc(bpp)  # the reserve serves the next alloc, as before
    assert sorted(got) == sorted(held) and not kv.reserved_blocks
    kv.free(got)
    kv.free(filler)
    kv.check_invariants()
    assert kv.used_blocks == 0
    kv.close()


def test_free_accepts_integer_types_by_value():
    np = pytest.importorskip("numpy")
    kv = _pool()
    got = kv.alloc(4)
    kv.free(np.array(got, dtype=np.int64))  # numpy ints: accepted, stored as plain ints
    kv.check_invariants()
    assert kv.used_blocks == 0 and sorted(kv.alloc(4)) == got
    kv.close()


def test_a_pool_that_fails_to_start_gives_its_reservation_back():
    dev = SimDevice("h200")
    taken = f"wbtest_taken_{os.getpid()}"
    first = _pool(ipc_name=taken)
    geo = KVGeometry(num_layers=2, kv_heads=4, head_dim=128, block_size=16, num_blocks=300)
    with pytest.raises(ConfigError, match="in use by live process"):
        KVCacheManager(geo, dev, name="p2", config=PoolConfig(ipc_name=taken))
    assert (dev.allocations, dev.mappings, dev.reservations) == ({}, {}, {})
    first.close()
