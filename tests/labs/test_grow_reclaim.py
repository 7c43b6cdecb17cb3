"""grow-reclaim (seed 000 §6): mapped pages follow load, only wholly empty pages go back, the
reserve sits between its min and max. Every check reads the raw timeline, not the lab's verdict."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from tests.labs.cli import run_lab_cli
from workbench.core.events import Event
from workbench.labs import run_lab
from workbench.labs.grow_reclaim.lab import GrowReclaimParams
from workbench.labs.grow_reclaim.sim import run_order, spec_for
from workbench.labs.kit.phased_sim import UnmapWatch, run_phased

P = GrowReclaimParams(quick=True)


def _end(run: dict, phase: str) -> dict:
    """Every column's last sample inside ``phase``."""
    tl = run["timeline"]["vllm0"]
    w = next(w for w in run["windows"]["vllm0"] if w["name"] == phase)
    i = max(j for j, t in enumerate(tl["t"]) if t < w["end"] - 1e-9)
    return {k: v[i] for k, v in tl.items()}


def _window(run: dict, phase: str) -> dict:
    tl = run["timeline"]["vllm0"]
    w = next(w for w in run["windows"]["vllm0"] if w["name"] == phase)
    idx = [j for j, t in enumerate(tl["t"]) if w["start"] - 1e-9 <= t < w["end"] - 1e-9]
    return {k: [v[j] for j in idx] for k, v in tl.items()}


@pytest.fixture(scope="module")
def baseline() -> dict:
    return run_phased(spec_for("baseline", P, 0))


def test_pages_follow_load_and_return_when_idle(baseline):
    ppb = baseline["page_id_bytes"]
    before = {"short": "idle-0", "long": "short", "short-again": "idle-1",
              "long-again": "short-again"}
    for load, prev in before.items():
        assert max(_window(baseline, load)["in_use_pages"]) > _end(baseline, prev)["in_use_pages"]
    for load, prev in (("long", "short"), ("long-again", "short-again")):
        peak = max(_window(baseline, load)["mapped_bytes"])
        assert peak > _end(baseline, prev)["mapped_bytes"]
        idle = _end(baseline, "idle-1" if load == "long" else "idle-2")
        # drained: only the null block's page is in use, the rest of what is mapped is reserve
        assert idle["running"] == idle["waiting"] == idle["used_blocks"] == 0
        assert idle["in_use_pages"] == 1
        assert idle["mapped_bytes"] == (1 + idle["reserved_pages"]) * ppb < peak


def test_mapped_is_in_use_plus_reserve_and_covers_the_blocks(baseline):
    tl, ppb, bpp = baseline["timeline"]["vllm0"], baseline["page_id_bytes"], \
        baseline["blocks_per_page"]
    for m, u, r, b in zip(tl["mapped_bytes"], tl["in_use_pages"], tl["reserved_pages"],
                          tl["used_blocks"], strict=True):
        assert m == (u + r) * ppb
        assert u >= math.ceil((b + 1) / bpp)  # + the null block


def test_no_page_with_a_live_block_is_unmapped(baseline):
    assert baseline["unmaps"] > 0 and baseline["parks"] > 0
    assert baseline["live_unmaps"] == []


def test_the_unmap_watch_sees_a_live_block():
    """The watch is not vacuous: an unmap event for a page that holds a block is reported."""
    import simpy

    from workbench.engines.sim.cluster import ClusterConfig, build_cluster

    env = simpy.Environment()
    _, (eng,) = build_cluster(ClusterConfig(num_instances=1, sample_every_s=None), env)
    ids = eng.kv.alloc(3)
    page = eng.kv.geometry.block_page(ids[0])
    watch = UnmapWatch({eng.name: eng})
    watch(Event(0.0, eng.name, page, "in_use", "free", "unmap"))
    assert watch.unmaps == 1 and watch.live_unmaps[0]["live_blocks"] >= 3


@pytest.mark.parametrize(("lo", "hi"), [(2, 4), (5, 10), (0, 3)])
def test_reserve_between_min_and_max(lo, hi):
    p = replace(P, min_reserved_pages=lo, max_reserved_pages=hi)
    run = run_phased(spec_for("baseline", p, 0))
    res = run["timeline"]["vllm0"]["reserved_pages"]
    assert max(res) <= hi
    assert _end(run, "idle-0")["reserved_pages"] == lo  # prealloc maps exactly the minimum
    for idle in ("idle-1", "idle-2"):  # a long phase empties many pages: parks fill to the max
        assert _end(run, idle)["reserved_pages"] == hi


def test_prefix_cache_keeps_pages_and_hits_on_repeat(baseline):
    run = run_phased(spec_for("prefix-cache", P, 0))
    bpp = run["blocks_per_page"]
    for idle in ("idle-1", "idle-2"):
        e = _end(run, idle)
        assert e["running"] == 0 and e["used_blocks"] == e["cached_blocks"] > 0
        assert e["in_use_pages"] >= math.ceil((e["cached_blocks"] + 1) / bpp)
        assert e["mapped_bytes"] > _end(baseline, idle)["mapped_bytes"]
    inst = run["instances"][0]
    assert inst["by_phase"]["long"]["prefix_hit_tokens"] == 0
    assert inst["by_phase"]["long-again"]["prefix_hit_tokens"] > 0
    assert inst["by_phase"]["long-again"]["ttft"]["p50"] < inst["by_phase"]["long"]["ttft"]["p50"]
    assert run["live_unmaps"] == []


def test_no_prealloc_maps_on_the_step_path(baseline):
    run = run_phased(spec_for("no-prealloc", P, 0))
    e = _end(run, "idle-0")
    assert e["reserved_pages"] == 0 and e["mapped_bytes"] == run["page_id_bytes"]
    assert run["instances"][0]["vmm_s"] > baseline["instances"][0]["vmm_s"]
    assert _end(run, "idle-2")["reserved_pages"] == P.max_reserved_pages  # parking still works


def test_order_alternates():
    assert run_order([0, 1]) == [("baseline", 0), ("prefix-cache", 0), ("no-prealloc", 0),
                                 ("no-prealloc", 1), ("prefix-cache", 1), ("baseline", 1)]


def test_lab_record_and_cli(tmp_path):
    res = run_lab("grow-reclaim", P, "sim")
    d = json.loads(res.record.to_json())
    assert d["verdict"] == "supported"
    assert d["samples"]["seeds"] == [0, 1]
    assert {c["variant"] for c in res.tables["checks"]} == {"baseline", "prefix-cache",
                                                            "no-prealloc"}
    assert all(c["live_unmaps"] == 0 for c in res.tables["checks"])
    assert ("| [seed 000 §6.3](../docs/sources.md#seed-000-s6-3) expects | measured (every seed) |"
            in res.markdown)  # the seed reference linked (workbench/citations.py)
    assert run_lab_cli(tmp_path / "g.json", "grow-reclaim", "--quick")["verdict"] == "supported"
