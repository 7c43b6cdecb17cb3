"""The chapters' runs with ``backend="gpu"``: the same scenarios on real CUDA virtual memory.

What a chapter's one-word switch promises: every scenario the chapters run works on the GPU
backend, the event trace still equals the pools' own state, and the ledger's invariants hold.
Skipped cleanly without cuda-python or a CUDA device (``make test-gpu`` runs it).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu():
    pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")
    from workbench.backends import make_device
    from workbench.errors import ConfigError, DeviceError

    try:
        make_device("gpu")
    except (ConfigError, DeviceError) as err:
        pytest.skip(f"no usable CUDA device: {err}")
    return "gpu"


def _same_as_pools(rec) -> None:
    states = rec.states_at(None)
    for name, kv in rec.managers.items():
        assert states[name] == [s.value for s in kv.pages.state]
        assert rec.series()[name]["mapped"][-1] == kv.mapped_bytes
        kv.check_invariants()


def _close(rec) -> None:
    for kv in rec.managers.values():
        kv.close()


def test_churn_with_limit_on_gpu(gpu):
    from workbench.viz.scenarios import churn

    res = churn(steps=30, load=6, limit_pages=10, limit_at=15, backend=gpu)
    _same_as_pools(res.rec)
    assert res.finished["pool"] > 0 and res.limit_results
    _close(res.rec)


def test_churn_matches_sim_event_for_event(gpu):
    """Same seeded run on both backends: the same page transitions (timings aside)."""
    from workbench.viz.scenarios import churn

    sim = churn(steps=25, load=6, limit_pages=8, limit_at=12, backend="sim")
    real = churn(steps=25, load=6, limit_pages=8, limit_at=12, backend=gpu)
    assert [e.key() for e in real.rec.events] == [e.key() for e in sim.rec.events]
    _close(real.rec)


def test_one_request_colocation_prefix_on_gpu(gpu):
    from workbench.viz.scenarios import colocation, one_request, prefix_sharing

    kv, ids, rec = one_request(300, backend=gpu)
    assert len(ids) == 19
    _same_as_pools(rec)
    _close(rec)
    co = colocation(steps=24, limit_pool="a", limit_gib=0.25, limit_at=4, backend=gpu)
    _same_as_pools(co.rec)
    _close(co.rec)
    pre = prefix_sharing(steps=12, max_cached_tokens=1024, backend=gpu)
    _same_as_pools(pre.rec)
    assert pre.hits > 0
    _close(pre.rec)
