"""Async release (seed 000 §11.3): a freed page is retired under an epoch and released only after
every worker confirmed its barrier. Plus the SGLang-style local mode (nothing broadcast)."""

from __future__ import annotations

from tests.tpp.helpers import BPP, GEO, W0, W1, assert_all_or_none, mapped_on, sim_pool
from workbench.core.events import PageState
from workbench.core.ledger import local_pools
from workbench.sim.device import SimDevice
from workbench.sim.workers import Fault

S = PageState


def test_retired_until_every_worker_passes_the_barrier():
    c, fan, kv = sim_pool(defer_release=True, faults=[Fault("drop_reply", op="barrier",
                                                            worker=W1)])
    ids = kv.alloc(BPP)
    kv.free(ids)  # a queued batch may still read page 1
    assert kv.pages.state[1] is S.RETIRED and mapped_on(c) == {W0: {0, 1}, W1: {0, 1}}
    marker = kv.capture_marker()
    assert fan.release_retired_through(kv, marker) == 0  # rank 1 did not confirm
    assert kv.pages.state[1] is S.RETIRED and mapped_on(c)[W1] == {0, 1}
    assert any(e.dst == "incomplete" for e in kv.events)
    assert not kv.pages.failed
    assert fan.release_retired_through(kv, marker) == 1  # the next barrier completes
    assert kv.pages.state[1] is S.FREE and mapped_on(c) == {W0: {0}, W1: {0}}
    kv.check_invariants()


def test_epochs_release_only_through_the_marker():
    c, fan, kv = sim_pool(defer_release=True)
    kv.alloc(BPP - 1)  # fill page 0 (the null block's page)
    a, b = kv.alloc(BPP), kv.alloc(BPP)  # page 1, page 2
    kv.free(a)
    m0 = kv.capture_marker()
    kv.free(b)  # retired under the next epoch
    assert fan.release_retired_through(kv, m0) == 1
    assert [s for s in kv.pages.state[1:3]] == [S.FREE, S.RETIRED]
    assert fan.release_retired_through(kv, kv.capture_marker()) == 1
    assert_all_or_none(c, fan)
    assert all(s["epoch"] == 1 for s in c.states().values())


def test_local_pools_touch_only_their_own_rank():
    devs = [SimDevice("h200", name=f"gpu{r}") for r in range(2)]
    pools = local_pools(GEO, devs)
    before = [len(d.allocations) for d in devs]
    ids = pools[0].alloc(3 * BPP)
    assert len(devs[0].allocations) > before[0] and len(devs[1].allocations) == before[1]
    pools[0].free(ids)
    assert pools[1].alloc(BPP) is not None
    for p in pools:
        p.check_invariants()
        p.close()
