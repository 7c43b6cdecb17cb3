"""TP worker processes on real CUDA VMM (``make test-gpu``): each rank maps its own pages in its
own CUDA context; the fault cases hold there too, and device memory returns to where it began."""

from __future__ import annotations

import pytest

from tests.tpp.helpers import BPP, GEO
from workbench.config import PoolConfig
from workbench.core.coordinator import WorkerId
from workbench.core.events import PageState
from workbench.core.ledger import KVCacheManager
from workbench.errors import StateConsistencyError
from workbench.transport import WorkerGroup

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("socket_base")]
W0, W1 = WorkerId(0, 0), WorkerId(0, 1)


def _gpu_count() -> int:
    pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")
    from cuda.bindings import driver as cu

    if cu.cuInit(0)[0] != cu.CUresult.CUDA_SUCCESS:
        pytest.skip("no usable CUDA driver")
    err, n = cu.cuDeviceGetCount()
    if err != cu.CUresult.CUDA_SUCCESS or n < 1:
        pytest.skip("no CUDA device")
    return n


def _free(g: WorkerGroup) -> dict[WorkerId, int]:
    return {t: s["free"] for t, s in g.states().items()}


def _held(g: WorkerGroup) -> dict[WorkerId, int]:
    return {t: s["held"] for t, s in g.states().items()}


def _fault_cycle(g: WorkerGroup, fan, kv: KVCacheManager) -> None:
    """The fault cases of one TP=2 pool, ending where it began: only page 0 mapped."""
    ids = kv.alloc(3 * BPP)
    assert fan.inconsistencies(g.states()) == []
    kv.free(ids)
    # callback: rank 1's map fails, rank 0 rolls back
    g.inject(W1, device={"create": 1})
    assert kv.alloc(BPP) is None and not kv.pages.failed
    # unmap: rank 1's prepare fails, abort everywhere
    ids = kv.alloc(BPP)
    g.inject(W1, device={"unmap": 1})
    kv.free(ids)
    assert kv.pages.state[1] is PageState.RESERVED
    # ipc-release: a lost commit reply is retried
    kv.trim()
    ids = kv.alloc(BPP)
    g.inject(W1, drop_reply="commit")
    kv.free(ids)
    assert kv.pages.state[1] is PageState.FREE and not kv.pages.failed
    # async release barrier syncs each worker's device
    assert fan.barrier(0)
    assert fan.inconsistencies(g.states()) == []
    kv.trim()  # back to the warm state: only page 0 (the null block) is mapped
    assert all(set(s["mapped"]) == {0} and not s["retained"] for s in g.states().values())


@pytest.mark.parametrize("spread", ["one_gpu", "two_gpus"])
def test_gpu_tp2_fault_cases_and_memory_returns(spread):
    n = _gpu_count()
    if spread == "two_gpus" and n < 2:
        pytest.skip("needs two GPUs")
    gpus = [0, 0] if spread == "one_gpu" else [0, 1]
    cfg = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=0)
    with WorkerGroup(GEO, tp=2, name=f"gpu-{spread}", backend="gpu", gpus=gpus) as g:
        fan = g.space(timeout=60.0)
        kv = KVCacheManager(GEO, space=fan, config=cfg)
        # The first pass grows the driver's own structures (page tables, a zero piece of the
        # page's size per context: seen on an H200 as 8-24 MiB that never come back); the second
        # identical pass must give back everything it took, or the pool leaks.
        _fault_cycle(g, fan, kv)
        free0, held0 = _free(g), _held(g)
        _fault_cycle(g, fan, kv)
        free1, held1 = _free(g), _held(g)
        print(f"{spread}: device free before {free0}, after {free1}; held {held0} -> {held1}")
        # Exact: each worker process holds the same physical bytes after the second cycle.
        assert held1 == held0
        if spread == "two_gpus":
            # One context per GPU: the driver's own free figure agrees within a page id. (Two
            # contexts on one H200 make it drift by 8-16 MiB with no pool activity, so there the
            # per-process figure above is the check.)
            for t, f in free1.items():
                assert free0[t] - f < GEO.page_id_bytes, (t, f, free0[t])
        kv.close()
    with WorkerGroup(GEO, tp=2, name="gpu-unknown", backend="gpu", gpus=gpus) as g:
        kv = KVCacheManager(GEO, space=g.space(timeout=60.0), config=cfg)
        g.inject(W1, drop_reply="map")
        with pytest.raises(StateConsistencyError):  # ipc-unknown: the pool fails, loudly
            kv.alloc(BPP)
        assert kv.pages.failed
