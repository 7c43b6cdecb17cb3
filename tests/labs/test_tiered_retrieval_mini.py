"""tiered-retrieval on the host backend (the mini engine, tiny model, a real host tier): the
causal claims read from the raw per-probe rows: a hit computes fewer tokens (HBM <= CPU < all
miss), the CPU hit moves exactly its blocks' bytes, a miss pays a lookup; L2 is listed as not
run, never simulated. No timing is asserted."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from workbench.labs import run_lab  # noqa: E402
from workbench.labs.tiered_retrieval.lab import TieredRetrievalParams  # noqa: E402
from workbench.labs.tiered_retrieval.mini import L2_NOT_RUN, MINI_GROUPS  # noqa: E402


@pytest.fixture(scope="module")
def res():
    torch.set_num_threads(1)
    return run_lab("tiered-retrieval", TieredRetrievalParams(quick=True, repeats=1), "host")


def test_hits_compute_less_and_move_exactly_their_blocks(res):
    d = json.loads(res.record.to_json())
    probes = d["outcomes"]
    assert set(probes) == set(MINI_GROUPS)
    row_bytes = 16 * 512  # tiny: 2 layers x K,V x 2 KV heads x 32 dims x 2 bytes, 16 tokens
    for h, c, m, b in zip(*(probes[g] for g in ("hbm", "cpu", "all-miss", "baseline")),
                          strict=True):
        assert b["prompt_len"] == 232 + 16 and b["computed"] == b["prompt_len"]
        assert h["local_hit"] == 224 and h["computed"] == 24  # 14 whole 16-token blocks
        assert c["external_hit"] == 192 and c["computed"] == 56  # 3 whole 64-token chunks
        assert c["h2d_bytes"] == 192 // 16 * row_bytes and c["chunks"] == {"dram": 3}
        assert m["external_hit"] == 0 and m["computed"] == m["prompt_len"] and m["lookup"] > 0
        assert h["h2d_bytes"] == m["h2d_bytes"] == b["h2d_bytes"] == 0
        for r in (h, c, m, b):
            parts = r["wait"] + r["lookup"] + r["retrieve"] + r["h2d"] + r["prefill"]
            assert parts == pytest.approx(r["ttft"]) and r["ttft"] > 0
    assert d["verdict"] == "supported"
    assert d["environment"]["l2"] == L2_NOT_RUN


def test_l2_is_reported_not_run(res):
    rows = {r["group"]: r for r in res.tables["groups"]}
    assert rows["l2"] == {"group": "l2", "not_run": L2_NOT_RUN}
    assert f"| l2 | {L2_NOT_RUN} |" in res.markdown
    assert set(res.record.phase_times) == set(MINI_GROUPS)
