"""Hypothesis-generated fault schedules over simulated TP/PP workers.

The invariant (issue 6): after any schedule of pool operations and faults — lost, late or
crashing messages at any protocol step, failing driver calls on any worker — every logical page
is mapped on all targets or on none, or it is quarantined, or the pool has failed; and a
quarantine or a failure is reported as an event, never silent.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tpp.helpers import BPP, GEO, TIMEOUT
from workbench.config import PoolConfig
from workbench.core.coordinator import FanOutSpace, targets_for
from workbench.core.events import EventLog, PageState
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError, StateConsistencyError
from workbench.sim.workers import FAULT_KINDS, PROTOCOL_OPS, Fault, SimCluster

DEVICE_OPS = ("create", "map", "set_access", "unmap", "release")


@st.composite
def schedules(draw):
    tp = draw(st.integers(1, 2))
    pp = draw(st.integers(1, 2))
    targets = targets_for(tp, pp)
    worker = st.sampled_from(targets)
    faults = draw(st.lists(st.builds(
        Fault, kind=st.sampled_from(FAULT_KINDS), op=st.sampled_from(PROTOCOL_OPS),
        worker=st.none() | worker, nth=st.integers(1, 4),
        delay=st.sampled_from([TIMEOUT / 2, 1.0])), max_size=3))
    device_faults = draw(st.dictionaries(
        worker, st.dictionaries(st.sampled_from(DEVICE_OPS),
                                st.lists(st.integers(1, 8), min_size=1, max_size=2),
                                max_size=2), max_size=2))
    ops = draw(st.lists(st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 2 * BPP)),
        st.tuples(st.just("free"), st.integers(0, 7)),
        st.tuples(st.just("release"), st.just(0)),
        st.tuples(st.just("trim"), st.just(0))), min_size=1, max_size=14))
    cfg = dict(defer_release=draw(st.booleans()), max_reserved=draw(st.integers(0, 2)))
    return tp, pp, faults, device_faults, ops, cfg


def _run(tp, pp, faults, device_faults, ops, cfg):
    c = SimCluster(GEO, tp, pp, faults=faults, device_faults=device_faults)
    events = EventLog()
    try:
        fan = FanOutSpace(GEO, c, targets_for(tp, pp), timeout=TIMEOUT, events=events)
    except StateConsistencyError:
        assert any(e.dst == "failed" for e in events), "a failure must be an event"
        return
    try:
        kv = KVCacheManager(GEO, space=fan, events=events, defer_release=cfg["defer_release"],
                            config=PoolConfig(prealloc=False, min_reserved_pages=0,
                                              max_reserved_pages=cfg["max_reserved"]))
    except (StateConsistencyError, ConfigError):  # e.g. the null block's page cannot be backed
        c.settle(5.0)
        assert fan.failed or fan.inconsistencies(c.states()) == []
        return
    held: list[list[int]] = []
    for op, arg in ops:
        try:
            if op == "alloc":
                ids = kv.alloc(arg)
                if ids:
                    held.append(ids)
            elif op == "free" and held:
                kv.free(held.pop(arg % len(held)))
            elif op == "release":
                fan.release_retired_through(kv, kv.capture_marker())
            elif op == "trim":
                kv.trim()
        except StateConsistencyError:
            assert fan.failed, "a consistency error must leave the pool failed"
    c.settle(5.0)  # late messages land
    if not fan.failed:
        with contextlib.suppress(StateConsistencyError):
            fan.ping()  # a crashed worker is found here
    if fan.failed:
        assert kv.pages.failed, "the allocator must refuse work too"
        assert any(e.page == -1 and e.dst == "failed" for e in events)
        return
    assert all(w.alive for w in c.workers.values())
    assert fan.inconsistencies(c.states()) == []
    kv.check_invariants()
    quarantined = {p for p, s in enumerate(kv.pages.state) if s is PageState.QUARANTINED}
    assert fan.quarantined <= quarantined
    for p in quarantined:
        assert any(e.page == p and e.dst == "quarantined" for e in events)
    for s in c.states().values():
        assert set(s["quarantined"]) <= quarantined


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_any_fault_schedule_keeps_pages_all_or_none(schedule):
    _run(*schedule)


# One deterministic run per (step, op): every protocol step of every message kind, on rank 1.
# The op script makes every message kind occur: a map, a map whose rollback sends unmap, a
# prepare that fails (so abort), a trim (prepare+commit) and a release barrier.
_SCRIPT = [("alloc", BPP), ("alloc", BPP), ("free", 0), ("trim", 0), ("release", 0),
           ("alloc", 2 * BPP)]


@pytest.mark.parametrize("op", PROTOCOL_OPS)
@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_every_protocol_step(kind, op):
    w1 = targets_for(2, 1)[1]
    device_faults = {targets_for(2, 1)[0]: {"create": [3]}, w1: {"unmap": [2]}}
    _run(2, 1, [Fault(kind, op=op, worker=w1)], device_faults, list(_SCRIPT),
         {"defer_release": False, "max_reserved": 0})
