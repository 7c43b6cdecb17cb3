"""The worker state machine on its own: prepare/commit/abort by txid, fences, refusals."""

from __future__ import annotations

from tests.tpp.helpers import GEO
from workbench.core.worker import MAX_FINALIZED, WorkerState
from workbench.sim.device import SimDevice


def worker() -> WorkerState:
    return WorkerState(GEO, SimDevice("h200"), name="pp0/w0")


def test_map_is_idempotent_and_reports_newly_mapped():
    w = worker()
    assert w.handle({"op": "map", "pages": [1, 2], "seq": 7})["newly_mapped"] == [1, 2]
    r = w.handle({"op": "map", "pages": [2, 3]})
    assert r["status"] == "ok" and r["newly_mapped"] == [3]  # only what this call mapped
    assert w.mapped() == {1, 2, 3}


def test_prepare_commit_is_idempotent():
    w = worker()
    w.handle({"op": "map", "pages": [1]})
    assert w.handle({"op": "prepare", "txid": "a", "pages": [1]})["state"] == "prepared"
    assert w.space.retained and not w.mapped()
    assert w.handle({"op": "commit", "txid": "a"})["state"] == "committed"
    assert w.handle({"op": "commit", "txid": "a"})["state"] == "committed"  # repeated: fine
    assert not w.space.retained and not w.device.allocations


def test_abort_restores_mapping_from_retained_handles():
    w = worker()
    w.handle({"op": "map", "pages": [4]})
    handles = list(w.space.handles[4])
    w.handle({"op": "prepare", "txid": "t", "pages": [4]})
    assert w.handle({"op": "abort", "txid": "t"})["state"] == "aborted"
    assert w.space.handles[4] == handles  # the same physical memory, no new allocation
    assert w.handle({"op": "commit", "txid": "t"})["error_type"] == "aborted"


def test_abort_before_prepare_is_remembered():
    w = worker()
    w.handle({"op": "map", "pages": [1]})
    r = w.handle({"op": "abort", "txid": "x"})
    assert r["status"] == "ok" and r["early"]
    late = w.handle({"op": "prepare", "txid": "x", "pages": [1]})
    assert late["error_type"] == "aborted" and w.mapped() == {1}


def test_commit_of_unknown_txid_fences_it():
    w = worker()
    w.handle({"op": "map", "pages": [1]})
    assert w.handle({"op": "commit", "txid": "y"})["error_type"] == "not_prepared"
    assert w.handle({"op": "prepare", "txid": "y", "pages": [1]})["error_type"] == "aborted"
    assert w.mapped() == {1}


def test_pending_transaction_refuses_other_map_and_unmap():
    w = worker()
    w.handle({"op": "map", "pages": [1, 2]})
    w.handle({"op": "prepare", "txid": "p", "pages": [1]})
    for msg in ({"op": "map", "pages": [3]}, {"op": "unmap", "pages": [2]},
                {"op": "prepare", "txid": "q", "pages": [2]}):
        r = w.handle(msg)
        assert r["error_type"] == "busy" and "another unmap transaction is pending" in r["message"]
    assert w.handle({"op": "prepare", "txid": "p", "pages": [1]})["state"] == "prepared"
    w.handle({"op": "commit", "txid": "p"})
    assert w.handle({"op": "map", "pages": [3]})["status"] == "ok"


def test_abort_after_commit_is_a_consistency_error():
    w = worker()
    w.handle({"op": "map", "pages": [1]})
    w.handle({"op": "prepare", "txid": "c", "pages": [1], "commit": True})
    assert w.handle({"op": "abort", "txid": "c"})["error_type"] == "state_consistency"
    assert w.handle({"op": "map", "pages": [2]})["error_type"] == "state_consistency"  # failed


def test_finalized_txids_are_bounded():
    w = worker()
    for i in range(MAX_FINALIZED + 10):
        w.handle({"op": "abort", "txid": f"t{i}"})
    assert len(w.finalized) == MAX_FINALIZED and "t0" not in w.finalized


def test_bad_requests_are_replies_not_exceptions():
    w = worker()
    assert w.handle({"op": "nope"})["error_type"] == "bad_request"
    assert w.handle({"op": "map", "pages": [10_000]})["error_type"] == "bad_request"
    assert w.handle({"op": "map"})["error_type"] == "bad_request"


def test_close_gives_memory_back():
    w = worker()
    dev = w.device
    w.handle({"op": "map", "pages": [1, 2]})
    w.handle({"op": "prepare", "txid": "z", "pages": [2]})
    w.handle({"op": "close"})
    assert not dev.allocations and not dev.mappings and not dev.reservations
