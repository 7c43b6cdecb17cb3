"""The fault matrix in simulation: kvcached 0.1.6's 15 failure-policy cases as the checklist.

kvcached runs each case through a CUDA-driver fault shim (``tests/test_vmm_failure_policy.py``).
Here each is a fault injected at the same protocol step of our coordinator and SimPy workers
(device call failures through FaultyDevice; lost, late, corrupted messages and crashes through
the sim transport), with our outcome:

==================  =========================================  ===================================
case                injected fault                             outcome (asserted below)
==================  =========================================  ===================================
quarantine          rank 1 set_access fails, its local undo    page QUARANTINED (never reissued);
                    (unmap) fails too                          rank 0 rolled back; pool goes on
prealloc            rank 1 create fails while refilling the    refill stops, page stays FREE on
                    reserve                                    both ranks; a later refill maps it
unmap               rank 1 unmap fails in prepare              abort on every rank: page mapped on
                                                               both, parked RESERVED, event
callback            rank 1 map fails (driver error)            rank 0 unmaps what it newly mapped;
                                                               alloc misses (None); pool goes on
fatal-callback      the transport raises mid-exchange          outcome unknown: pool FAILED,
                                                               StateConsistencyError, event
manager             2nd page of a 2-page alloc fails           ledger restored exactly (None);
                                                               pages emptied by the undo unmapped
serialize           map while an unmap txn is pending          worker refuses ("busy"): map rolled
                                                               back; works after commit
release             single target: release fails in the        pool FAILED, page QUARANTINED;
                    folded prepare+commit                      one round trip
commit-release      TP=2: rank 1 release fails in commit       pool FAILED, page QUARANTINED
rollback-release    rank 1 map fails, rank 0's rollback        page QUARANTINED; pool goes on
                    release fails
state-gil           4 threads map/unmap through one pool       serialised by the coordinator's
                                                               lock: no error, all-or-none
ipc-ack             rank 1 acks with a malformed reply         treated as unknown: pool FAILED
ipc-unknown         rank 1's map reply is lost                 pool FAILED, StateConsistencyError,
                                                               rank 0 rolled back (best effort)
ipc-prepare         rank 1's prepare reply lost / prepare      abort everywhere; a late prepare is
                    request late                               refused (fenced); page stays mapped
ipc-release         rank 1's commit reply lost once / twice    retried commit (idempotent) → done /
                                                               pool FAILED state_consistency_unknown
==================  =========================================  ===================================
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from tests.tpp.helpers import (
    BPP,
    GEO,
    TIMEOUT,
    W0,
    W1,
    assert_all_or_none,
    causes,
    mapped_on,
    sim_pool,
)
from workbench.core.coordinator import FanOutSpace, targets_for
from workbench.core.events import PageState
from workbench.errors import PoolFailedError, StateConsistencyError
from workbench.sim.workers import Fault, SimCluster

S = PageState


def test_quarantine():
    c, fan, kv = sim_pool(device_faults={W1: {"set_access": [2], "unmap": [1]}})
    assert kv.alloc(BPP) is None  # page 1 could not be backed
    assert kv.pages.state[1] is S.QUARANTINED and fan.quarantined == {1}
    assert 1 not in mapped_on(c)[W0]  # rank 0 undid its half
    assert any(e.dst == "quarantined" for e in kv.events)
    ids = kv.alloc(BPP)  # the pool goes on, with page 2
    assert ids is not None and kv.pages.state[2] is S.IN_USE and not kv.pages.failed
    kv.check_invariants()
    assert_all_or_none(c, fan)


def test_prealloc():
    c, fan, kv = sim_pool(prealloc=True, min_reserved=2, max_reserved=2,
                          device_faults={W1: {"create": [3]}})  # page 0, 1 fine; page 2 fails
    # the refill stopped at page 2 (rolled back on rank 0); the constructor's second refill
    # mapped it cleanly: a failed map is recoverable
    fails = [e for e in kv.events if e.cause.startswith("map_failed")]
    assert [e.page for e in fails] == [2] and fails[0].dst == "free"
    assert kv.pages.reserved == [1, 2] and not kv.pages.failed
    assert mapped_on(c) == {W0: {0, 1, 2}, W1: {0, 1, 2}}
    kv.check_invariants()


def test_unmap_prepare_failure_aborts_everywhere():
    c, fan, kv = sim_pool(device_faults={W1: {"unmap": [1]}})
    ids = kv.alloc(BPP)
    kv.free(ids)  # page 1 empties: prepare fails on rank 1
    assert kv.pages.state[1] is S.RESERVED  # still mapped everywhere, parked
    assert mapped_on(c) == {W0: {0, 1}, W1: {0, 1}}
    assert any(x.startswith("unmap_aborted") for x in causes(kv))
    assert any(x.startswith("unmap_failed") for x in causes(kv))
    assert not kv.pages.failed
    kv.check_invariants()
    assert_all_or_none(c, fan)


def test_callback_map_failure_rolls_back_other_rank():
    c, fan, kv = sim_pool(device_faults={W1: {"create": [2]}})
    before = c.device_bytes(W0)
    assert kv.alloc(BPP) is None
    assert c.device_bytes(W0) == before  # rank 0 gave back exactly what it newly mapped
    assert mapped_on(c) == {W0: {0}, W1: {0}}
    assert any(x.startswith("map_rollback") for x in causes(kv))
    assert kv.alloc(BPP) is not None and not kv.pages.failed
    assert_all_or_none(c, fan)


class _Raising(SimCluster):
    raise_on: str | None = None

    def exchange(self, requests, timeout):
        if any(m.op == self.raise_on for m in requests.values()):
            self.raise_on = None
            super().exchange(requests, timeout)  # delivered, then the transport blows up
            raise RuntimeError("listener thread crashed")
        return super().exchange(requests, timeout)


def test_fatal_callback_fails_pool():
    c, fan, kv = sim_pool(cluster_cls=_Raising)
    c.raise_on = "map"
    with pytest.raises(StateConsistencyError, match="outcome unknown"):
        kv.alloc(BPP)
    assert kv.pages.failed and fan.failed
    assert any(e.dst == "failed" for e in kv.events)
    with pytest.raises(PoolFailedError):
        kv.alloc(1)


def test_manager_rollback_restores_ledger():
    c, fan, kv = sim_pool(device_faults={W1: {"create": [3]}})  # page 2 fails on rank 1
    assert kv.alloc(2 * BPP) is None
    assert kv.used_blocks == 0 and kv.misses >= 1
    assert mapped_on(c) == {W0: {0}, W1: {0}}  # page 1, emptied by the undo, is unmapped
    kv.check_invariants()
    assert kv.alloc(2 * BPP) is not None


def test_serialize_pending_transaction_refuses_map():
    c, fan, kv = sim_pool()
    fan.map_page(5)
    fan.prepare_unmap(5)  # pending on both workers
    assert kv.alloc(BPP) is None  # the map of page 1 is refused by both: rolled back
    assert any("another unmap transaction is pending" in x for x in causes(kv))
    fan.commit_unmap(5)
    assert kv.alloc(BPP) is not None
    kv.check_invariants()
    assert_all_or_none(c, fan)


def test_release_failure_single_target_fails_pool():
    c, fan, kv = sim_pool(tp=1, device_faults={W0: {"release": [1]}})
    ids = kv.alloc(BPP)
    trips = fan.round_trips
    with contextlib.suppress(StateConsistencyError):
        kv.free(ids)
    assert fan.round_trips == trips + 1  # prepare carried the commit
    assert kv.pages.failed and kv.pages.state[1] is S.QUARANTINED
    with pytest.raises(PoolFailedError):
        kv.alloc(1)


def test_commit_release_failure_fails_pool():
    c, fan, kv = sim_pool(device_faults={W1: {"release": [1]}})
    ids = kv.alloc(BPP)
    with contextlib.suppress(StateConsistencyError):
        kv.free(ids)
    assert kv.pages.failed and kv.pages.state[1] is S.QUARANTINED
    st = c.states()
    assert 1 not in st[W0]["mapped"] + st[W0]["retained"]  # rank 0 committed
    assert 1 in st[W1]["retained"]  # rank 1 kept the handle it could not release
    with pytest.raises(PoolFailedError):
        kv.alloc(1)


def test_rollback_release_failure_quarantines():
    c, fan, kv = sim_pool(device_faults={W1: {"create": [2]}, W0: {"release": [1]}})
    assert kv.alloc(BPP) is None
    assert kv.pages.state[1] is S.QUARANTINED and not kv.pages.failed
    assert kv.alloc(BPP) is not None  # page 2
    kv.check_invariants()
    assert_all_or_none(c, fan)


def test_state_gil_concurrent_callers_serialised():
    c, fan, kv = sim_pool()
    errors: list[BaseException] = []

    def work(page: int) -> None:
        try:
            for _ in range(10):
                fan.map_page(page)
                fan.unmap_page(page)
            fan.map_page(page)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=work, args=(p,)) for p in (10, 11, 12, 13)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert mapped_on(c) == {W0: {0, 10, 11, 12, 13}, W1: {0, 10, 11, 12, 13}}
    assert_all_or_none(c, fan)


class _BadAck(SimCluster):
    def exchange(self, requests, timeout):
        replies = super().exchange(requests, timeout)
        if any(m.op == "map" for m in requests.values()) and W1 in replies:
            replies[W1] = {"status": "success"}  # kvcached SNAP's ack: no seq, no result
        return replies


def test_ipc_ack_malformed_reply_fails_pool():
    c, fan, kv = sim_pool()
    c.__class__ = _BadAck
    with pytest.raises(StateConsistencyError, match="malformed reply"):
        kv.alloc(BPP)
    assert kv.pages.failed


def test_ipc_unknown_lost_map_reply_fails_pool():
    c, fan, kv = sim_pool(faults=[Fault("drop_reply", op="map", worker=W1, nth=2)])
    with pytest.raises(StateConsistencyError, match="outcome unknown"):
        kv.alloc(BPP)
    assert kv.pages.failed
    assert any(x.startswith("map_unknown") for x in causes(kv))
    assert mapped_on(c)[W0] == {0}  # rank 0's half was rolled back (best effort)
    with pytest.raises(PoolFailedError):
        kv.free([1])


def test_ipc_prepare_reply_lost_aborts():
    c, fan, kv = sim_pool(faults=[Fault("drop_reply", op="prepare", worker=W1)])
    ids = kv.alloc(BPP)
    kv.free(ids)
    assert kv.pages.state[1] is S.RESERVED and not kv.pages.failed
    assert mapped_on(c) == {W0: {0, 1}, W1: {0, 1}}
    kv.check_invariants()


def test_ipc_prepare_late_is_fenced_by_abort():
    c, fan, kv = sim_pool(faults=[Fault("delay_request", op="prepare", worker=W1, delay=1.0)])
    ids = kv.alloc(BPP)
    kv.free(ids)  # rank 1 never answered in time: abort everywhere
    assert kv.pages.state[1] is S.RESERVED
    c.settle(5.0)  # the late prepare arrives now
    w1 = c.workers[W1]
    assert w1.handled.count("prepare") == 1 and w1.handled.index("abort") < w1.handled.index(
        "prepare")
    assert list(w1.state.finalized.values())[-1] == "aborted"
    assert mapped_on(c) == {W0: {0, 1}, W1: {0, 1}}  # the late prepare did not reopen it
    assert w1.state.pending is None
    kv.check_invariants()
    assert kv.alloc(BPP) is not None  # the worker is not stuck in a transaction


def test_ipc_release_commit_reply_lost_once_retries():
    c, fan, kv = sim_pool(faults=[Fault("drop_reply", op="commit", worker=W1)])
    ids = kv.alloc(BPP)
    kv.free(ids)
    assert kv.pages.state[1] is S.FREE and not kv.pages.failed
    assert c.workers[W1].handled.count("commit") == 2  # the retry was idempotent
    assert mapped_on(c) == {W0: {0}, W1: {0}}
    kv.check_invariants()


def test_ipc_release_commit_unconfirmed_fails_pool():
    c, fan, kv = sim_pool(faults=[Fault("drop_reply", op="commit", worker=W1, nth=1),
                                  Fault("drop_reply", op="commit", worker=W1, nth=2)])
    ids = kv.alloc(BPP)
    with contextlib.suppress(StateConsistencyError):
        kv.free(ids)
    assert kv.pages.failed and "state_consistency_unknown" in kv.pages.failed
    assert kv.pages.state[1] is S.QUARANTINED


# -- beyond the 15: single-target fold, PP fan-out, missing listener -------------------------
def test_single_target_ambiguous_prepare_retries_commit_never_aborts():
    c, fan, kv = sim_pool(tp=1, faults=[Fault("drop_reply", op="prepare", worker=W0)])
    ids = kv.alloc(BPP)
    kv.free(ids)
    assert c.workers[W0].handled[-2:] == ["prepare", "commit"]  # no abort
    assert kv.pages.state[1] is S.FREE and mapped_on(c) == {W0: {0}}


def test_single_target_lost_prepare_is_fenced_by_commit():
    c, fan, kv = sim_pool(tp=1, faults=[Fault("drop_request", op="prepare", worker=W0)])
    ids = kv.alloc(BPP)
    kv.free(ids)  # the commit finds no prepare: fences the txid, the page stays mapped
    assert kv.pages.state[1] is S.RESERVED and mapped_on(c) == {W0: {0, 1}}
    kv.check_invariants()


@pytest.mark.parametrize("pp_rank", [-1, 1])
def test_pp_fan_out(pp_rank):
    c, fan, kv = sim_pool(tp=2, pp=2, pp_rank=pp_rank)
    kv.alloc(BPP)
    on = mapped_on(c)
    for t in targets_for(2, 2):
        want = {0, 1} if pp_rank == -1 or t.pp == pp_rank else set()
        assert on[t] == want, (t, on)


def test_missing_stage_listener_fails_before_any_stage_changes():
    from workbench.core.coordinator import TransportError, WorkerId

    c = SimCluster(GEO, 2, 2, missing=[WorkerId(1, 0)])
    with pytest.raises(TransportError, match="pp1/w0"):
        FanOutSpace(GEO, c, targets_for(2, 2), timeout=TIMEOUT)
    # also mid-run: the listener disappears after the pool was built
    c = SimCluster(GEO, 2, 2)
    fan = FanOutSpace(GEO, c, targets_for(2, 2), timeout=TIMEOUT)
    del c.workers[WorkerId(1, 1)]
    with pytest.raises(TransportError):
        fan.map_page(3)
    assert all(3 not in s["mapped"] for s in c.states().values())
    assert not fan.failed
