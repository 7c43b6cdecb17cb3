"""store-routes (seed 003 E6): the store's master and its transfer path do separate work; one
instance reads what another saved; a cache layer in front of the store serves repeats locally
and changes nothing when nothing is reused; a full store evicts LRU and keeps its capacity. The
checks read the raw per-request rows and the store's counters, not the lab's verdict."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from workbench.engines.models import get_model
from workbench.labs import run_lab
from workbench.labs.store_routes.lab import StoreRoutesParams
from workbench.labs.store_routes.sim import ROUTES, SCENARIOS, run_case, sweep

P = StoreRoutesParams(quick=True, repeats=1, seed=2)
KVB = get_model(P.model).kv_bytes_per_token
DOC_CHUNKS = P.doc_len // P.chunk_tokens
DOC_BYTES = DOC_CHUNKS * P.chunk_tokens * KVB


@pytest.fixture(scope="module")
def data() -> dict:
    return sweep(P)


def _run(d: dict, route: str, scenario: str) -> dict:
    return d["runs"][route][scenario][P.seed]


def _reads(run: dict) -> list[dict]:
    return [r for r in run["rows"] if r["phase"] == "read"]


def test_master_counts_every_lookup_and_put(data):
    for r in ROUTES:
        for s in SCENARIOS:
            run = _run(data, r, s)
            rows = run["rows"]
            # a lookup goes to the master unless the local tier covered the whole chain
            lookups = sum(x["read_meta"] for x in rows)
            puts = sum(x["write_meta"] for x in rows)
            assert run["store"]["metadata_requests"] == lookups + puts
            assert run["store"]["payload_read"] == sum(x["read_bytes"] for x in rows)
            assert math.isclose(run["store"]["metadata_s"],
                                (lookups + puts) * P.meta_ms * 1e-3)


def test_cross_instance_reads_on_both_routes(data):
    for r in ROUTES:
        for x in _reads(_run(data, r, "warm")):
            assert x["instance"] == "i2" and x["hit"] == DOC_CHUNKS * P.chunk_tokens
            assert x["chunks"] == {"remote": DOC_CHUNKS}
            assert x["cross_instance_chunks"] == DOC_CHUNKS and x["read_bytes"] == DOC_BYTES


def test_the_cache_layer_changes_nothing_on_a_miss(data):
    a, b = (_run(data, r, "miss")["store"] for r in ROUTES)
    assert a["metadata_requests"] == b["metadata_requests"] == 2 * P.docs  # lookup + put each
    assert a["payload_written"] == b["payload_written"] == P.docs * DOC_BYTES
    assert a["payload_read"] == b["payload_read"] == 0


def test_hot_spot_repeats_are_served_locally_by_the_cache_layer(data):
    direct, cached = (_reads(_run(data, r, "hotspot")) for r in ROUTES)
    assert [x["doc"] for x in direct] == [x["doc"] for x in cached]  # the same reads
    assert sum(x["read_bytes"] for x in direct) == len(direct) * DOC_BYTES
    assert all(x["read_meta"] == 1 for x in direct)
    # via the cache layer: a document crosses the network once per instance that lacks it
    first_reads = {(x["instance"], x["doc"]) for x in cached if x["instance"] == "i2"}
    assert sum(x["read_bytes"] for x in cached) == len(first_reads) * DOC_BYTES
    assert sum(x["read_meta"] for x in cached) == len(first_reads)
    local = [x for x in cached if x["chunks"] == {"dram": DOC_CHUNKS}]
    assert len(local) == len(cached) - len(first_reads)
    assert max(x["ttft"] for x in local) < min(x["ttft"] for x in direct)


def test_pressure_evicts_lru_within_capacity(data):
    for r in ROUTES:
        run = _run(data, r, "pressure")
        st = run["store"]
        assert st["used_bytes"] <= st["capacity_bytes"] == P.store_docs * DOC_BYTES
        hit_docs = [x["doc"] for x in _reads(run) if x["hit"]]
        assert hit_docs == list(range(P.docs - 1, P.docs - 1 - P.store_docs, -1))  # the newest
        assert st["evictions"] >= (P.docs - P.store_docs) * DOC_CHUNKS


def test_bandwidth_moves_transfer_time_not_metadata_time():
    fast = run_case(P, "direct", "warm", 0)["store"]
    slow = run_case(replace(P, remote_gbps=P.remote_gbps / 2), "direct", "warm", 0)["store"]
    assert math.isclose(slow["metadata_s"], fast["metadata_s"])
    assert slow["transfer_s"] > 1.9 * fast["transfer_s"]


def test_lab_record():
    res = run_lab("store-routes", StoreRoutesParams(quick=True), "sim")
    d = json.loads(res.record.to_json())
    assert d["verdict"] == "supported"
    assert len(res.tables["cases"]) == len(ROUTES) * len(SCENARIOS)
    assert [c["local_tier"] for c in res.tables["config"]][0] == "none"
