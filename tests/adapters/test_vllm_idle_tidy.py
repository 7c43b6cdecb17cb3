"""An idle vLLM runs no scheduler step, so whatever the pool leaves for later lands on the next
request: on an H100 the 19 pages a batch of 64 had retired were unmapped (2.0 ms) inside the first
low-load request after it. vLLM's engine-core loop tells its idle callbacks before it waits for
work; there every elastic pool releases its retired pages and refills its reserve, and from then
on an allocation that drains the reserve leaves the refill to the next idle moment."""

from __future__ import annotations

import logging
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.adapters import vllm_fake
from tests.adapters.test_vllm_reset_reap import Fence
from workbench.config import PoolConfig
from workbench.core.events import PageState
from workbench.core.geometry import KVGeometry, Layout
from workbench.units import MiB

BLOCKS, BPP = 128, 16  # 8 pages of 16 blocks; page 0 holds the null block


def _pool(monkeypatch, name, *, min_res=2, max_res=3):
    vllm_fake.install(monkeypatch)
    from workbench.adapters.vllm import registry
    from workbench.adapters.vllm.ledger import BlockLedger
    from workbench.adapters.vllm.pool import ElasticBlockPool
    from workbench.backends import make_device

    geo = KVGeometry(num_layers=1, kv_heads=1, head_dim=128 * 1024, block_size=1,
                     num_blocks=BLOCKS, num_buffers=1, dtype_bytes=1, page_size=2 * MiB,
                     layout=Layout.CONTIGUOUS)
    dev = make_device("sim", name=name, capacity=geo.num_pages * 2 * MiB + 64 * MiB)
    kv = BlockLedger(geo, dev, name=name, defer_release=True,
                     config=PoolConfig(min_reserved_pages=min_res, max_reserved_pages=max_res))
    kv.fence = Fence
    registry.register(BLOCKS, kv)
    try:
        pool = ElasticBlockPool(BLOCKS, False, 16)
    finally:
        registry.ledgers.remove((BLOCKS, kv))
    return pool, kv, registry


def _causes(kv, since: int) -> list[str]:
    return [e.cause.split("@")[0] for e in kv.events.events[since:] if e.page >= 0]


def test_idle_releases_the_retired_pages_and_refills_so_the_next_request_maps_only_its_own(
        monkeypatch):
    pool, kv, registry = _pool(monkeypatch, "idle-tidy")
    p = kv.pages
    blocks = pool.get_new_blocks(15 + 4 * BPP)  # the rest of page 0, then pages 1-4
    pool.free_blocks(blocks)  # the request ends: its pages retire behind a fence
    assert sum(s is PageState.RETIRED for s in p.state) == 4
    registry.tidy_idle()  # the engine went idle: the fence is waited for, the pages go
    assert not p.retired and len(p.reserved) == 3  # parked up to the cap, the rest unmapped
    assert p.mapped_pages == 1 + 3
    mark = len(kv.events)
    blocks = pool.get_new_blocks(15 + 5 * BPP)  # five pages: three from the reserve, two maps
    assert sorted(_causes(kv, mark)) == ["map", "map", "reuse", "reuse", "reuse"]
    assert p.reserved == []  # the refill waits for the next idle moment
    pool.free_blocks(blocks)
    mark = len(kv.events)
    registry.tidy_idle()
    assert sorted(_causes(kv, mark)) == ["park"] * 3 + ["unmap"] * 2
    assert len(p.reserved) == 3 and not p.retired
    kv.check_invariants()
    kv.close()


def test_before_the_first_idle_moment_the_reserve_refills_inline(monkeypatch):
    """An engine whose loop never says it is idle (the engine core in the caller's process)
    keeps the pool's inline refill: nothing would refill the reserve otherwise."""
    pool, kv, _ = _pool(monkeypatch, "idle-never")
    mark = len(kv.events)
    pool.get_new_blocks(15 + BPP)  # page 1 from the reserve, which refills at once
    assert "prealloc" in _causes(kv, mark) and len(kv.pages.reserved) == 2
    kv.close()


# the engine's two moments the pool works in off the request path: (the registry's call for
# every pool, the ledger's own): the idle loop (``idle-tidy``) and a step's refill (``step-refill``)
MOMENTS = {"idle": ("tidy_idle", "tidy"), "step": ("refill_in_step", "refill_in_step")}


def heard(caplog, *calls) -> list[str]:
    """The workbench.autopatch lines logged while ``calls`` ran (boot.py stops that logger
    propagating, so the test's handler is put on it for the while)."""
    log = logging.getLogger("workbench.autopatch")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(log, "propagate", False)
        m.setattr(log, "level", logging.ERROR)
        log.addHandler(caplog.handler)
        try:
            for call in calls:
                call()
        finally:
            log.removeHandler(caplog.handler)
    return [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_failed_or_closed_pool_is_left_alone(monkeypatch, moment):
    every, own = MOMENTS[moment]
    pool, kv, registry = _pool(monkeypatch, f"{moment}-failed")
    held = pool.get_new_blocks(15 + 3 * BPP)  # the reserve drained, and a page more
    pool.free_blocks(held[-BPP:])  # that page retires: an idle tidy would release it
    kv.pages.fail("a lost reply")
    before = len(kv.events)
    assert getattr(kv, own)() == 0 and len(kv.events) == before  # no unmap, no map
    kv.pages.failed = None
    pool.free_blocks(held[:-BPP])
    kv.close()
    getattr(registry, every)()  # a closed pool: nothing, no error
    assert getattr(kv, own)() == 0


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_refill_whose_map_fails_stops_short_and_the_next_moment_retries(monkeypatch, moment):
    from workbench.errors import DeviceError

    pool, kv, registry = _pool(monkeypatch, f"{moment}-full")
    every = getattr(registry, MOMENTS[moment][0])
    every()
    held = pool.get_new_blocks(15 + 2 * BPP)  # both reserved pages: the reserve is empty
    space, real = kv.space, kv.space.map_page

    def full(page):
        raise DeviceError("map", "out of device memory", 2)

    monkeypatch.setattr(space, "map_page", full)
    every()  # the engine's loop goes on: no exception reaches it
    assert kv.pages.reserved == [] and "map_failed" in kv.events.events[-1].cause
    monkeypatch.setattr(space, "map_page", real)
    every()
    assert len(kv.pages.reserved) == 2
    pool.free_blocks(held)
    kv.check_invariants()
    kv.close()


def test_an_unmap_that_fails_past_undo_at_idle_fails_the_pool_not_the_engine_loop(
        monkeypatch, caplog):
    from workbench.errors import PoolFailedError, StateConsistencyError

    pool, kv, registry = _pool(monkeypatch, "idle-broken")
    registry.tidy_idle()
    pool.free_blocks(pool.get_new_blocks(15 + 4 * BPP))  # four pages retire

    def broken(page, **kw):
        raise StateConsistencyError(f"page {page}: the driver lost track of it")

    monkeypatch.setattr(kv.space, "prepare_unmap", broken)
    lines = heard(caplog, registry.tidy_idle)  # returns: vLLM's idle loop goes on
    assert kv.pages.failed is not None
    assert [line.count("\n") for line in lines] == [0]
    assert "pool idle-broken failed while the engine was idle" in lines[0]
    with pytest.raises(PoolFailedError):
        pool.get_new_blocks(1)  # the next request meets the failed pool
    caplog.clear()
    assert heard(caplog, registry.tidy_idle) == []  # a failed pool is left alone: no line


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("alloc"), st.integers(1, 40)),
                          st.tuples(st.just("free"), st.integers(0, 5)),
                          st.just(("idle", 0))), max_size=30))
def test_idle_tidying_keeps_the_pool_whole_and_refills_only_there(ops):
    with pytest.MonkeyPatch.context() as monkeypatch:
        pool, kv, registry = _pool(monkeypatch, "idle-prop")
        p, held, tidied = kv.pages, [], False
        for op, n in ops:
            mark = len(kv.events)
            if op == "alloc" and n <= pool.get_num_free_blocks():
                held.append(pool.get_new_blocks(n))
            elif op == "free" and held:
                pool.free_blocks(held.pop(n % len(held)))
            elif op == "idle":
                registry.tidy_idle()
                tidied = True
                assert not p.retired  # every fence was waited for
                assert len(p.reserved) >= min(p.min_reserved, p.num_pages - p.counts[
                    PageState.IN_USE] - p.counts[PageState.QUARANTINED])
            if tidied and op != "idle":
                assert "prealloc" not in _causes(kv, mark)  # no refill on a request's path
            kv.check_invariants()
        kv.close()


def _engine_core(calls_idle: bool = True) -> types.ModuleType:
    log: list[str] = []

    class EngineCoreProc:
        def has_work(self):
            return False

        def _notify_idle_state_callbacks(self):
            log.append("vllm's callbacks")

        if calls_idle:
            def _process_input_queue(self):
                while not self.has_work():
                    self._notify_idle_state_callbacks()
                    break
        else:
            def _process_input_queue(self):
                return self.has_work()

    return types.SimpleNamespace(__name__="vllm.v1.engine.core", EngineCoreProc=EngineCoreProc,
                                 log=log)


def test_the_idle_seam_tidies_first_then_runs_vllms_own_callbacks(monkeypatch):
    from workbench.adapters.vllm import registry, seams

    m = _engine_core()
    assert seams.check_idle(m) is None
    monkeypatch.setattr(registry, "tidy_idle", lambda: m.log.append("tidy"))
    undo = seams.apply_idle(m)
    m.EngineCoreProc()._process_input_queue()
    assert m.log == ["tidy", "vllm's callbacks"]
    undo()
    m.EngineCoreProc()._process_input_queue()
    assert m.log[2:] == ["vllm's callbacks"]


def test_a_loop_that_no_longer_notifies_its_idle_callbacks_is_named_and_skipped():
    from workbench.adapters.vllm import seams

    why = seams.check_idle(_engine_core(calls_idle=False))
    assert "_process_input_queue no longer uses self._notify_idle_state_callbacks()" in why
    assert "has no EngineCoreProc" in seams.check_idle(types.SimpleNamespace())
    patch = seams.idle_patch(">=0.26.0,<0.27.0", "fix")
    assert patch.required is False and patch.module == "vllm.v1.engine.core"
