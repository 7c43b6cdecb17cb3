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
from workbench.errors import PoolFailedError, StateConsistencyError
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
                assert pool.allocated - {0} == self.owned[name]
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
