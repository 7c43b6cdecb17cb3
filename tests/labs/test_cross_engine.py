"""cross-engine (seed 000 §8): two engines with no shared metadata reuse each other's physical
pages through the device alone, and nothing makes their share fair. The checks read the runs."""

from __future__ import annotations

import json

import pytest

from workbench.labs import run_lab
from workbench.labs.cross_engine.lab import CrossEngineParams
from workbench.labs.cross_engine.report import _inst, _total, _win, p99, peak
from workbench.labs.cross_engine.sim import configs, spec_for, sweep
from workbench.labs.kit.phased_sim import run_phased
from workbench.units import GiB

P = CrossEngineParams(quick=True)
BUDGET = int(P.kv_budget_gib * GiB)


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    return {c.name: run_phased(spec_for(c, P, seed=2)) for c in configs(P)}


def test_engines_share_no_metadata():
    """Each engine allocates from its own pool: block tables and radix trees live apart."""
    import simpy

    from workbench.engines.sim.cluster import ClusterConfig, build_cluster

    _, (v, s) = build_cluster(ClusterConfig(kinds=("vllm", "sglang"), num_instances=2,
                                            sample_every_s=None), simpy.Environment())
    assert v.kv is not s.kv and v.kv.device is s.kv.device  # two pools, one device
    assert not hasattr(v, "cache") and not hasattr(s, "pool")


def test_stage2_pages_move_across_engines(runs):
    for name, first, second in (("alternate-vllm-first", "vllm", "sglang"),
                                ("alternate-sglang-first", "sglang", "vllm")):
        run = runs[name]
        # the second maps more than was left at the first one's peak: memory the first held
        assert peak(run, first, "P1") + peak(run, second, "P2") > BUDGET
        assert max(_total(run)) <= BUDGET
        drained = _win(run, first, "P2")
        assert drained["in_use_pages"][-1] == 1 and drained["running"][-1] == 0


def test_stage3_each_scheduler_meets_its_own_misses(runs):
    tog = runs["together"]
    assert max(_total(tog)) >= BUDGET - 2 * tog["page_id_bytes"]
    for k in ("vllm", "sglang"):
        assert _inst(tog, k)["stats"]["misses"] > 0
        assert p99(tog, k, "P1") > p99(runs[f"alone-{k}"], k, "P1")
        assert _inst(runs[f"alone-{k}"], k)["summary"]["preemptions"] == 0


@pytest.mark.parametrize(("name", "holder", "other", "ref"), [
    ("vllm-cache-only", "vllm", "sglang", "alternate-vllm-first"),
    ("sglang-cache-only", "sglang", "vllm", "alternate-sglang-first")])
def test_stages45_an_unbounded_cache_starves_the_other(runs, name, holder, other, ref):
    run, base = runs[name], runs[ref]
    idle = _win(run, holder, "P2")
    assert idle["used_blocks"][-1] == idle["cached_blocks"][-1] > 0  # only cache left
    # starved: the other engine never maps past its idle floor (null page + reserve)
    floor = _win(run, other, "P1")["mapped_bytes"][-1]
    assert peak(run, other, "P2") == floor < peak(base, other, "P2")
    assert p99(run, other, "P2") > 10 * p99(base, other, "P2")


def test_stage6_the_bigger_bound_wins_and_swapping_swaps(runs):
    vb, sb = runs["bounds-vllm-big"], runs["bounds-sglang-big"]
    assert p99(vb, "vllm", "peak") < p99(vb, "sglang", "peak")
    assert p99(sb, "sglang", "peak") < p99(sb, "vllm", "peak")
    # the warm-up left more cached pages with the bigger bound
    assert _win(vb, "vllm", "pause")["cached_blocks"][-1] > \
        _win(vb, "sglang", "pause")["cached_blocks"][-1]


def test_no_live_unmaps(runs):
    assert sum(r["unmaps"] for r in runs.values()) > 0
    assert all(r["live_unmaps"] == [] for r in runs.values())


def test_order_alternates_and_lab_record():
    data = sweep(CrossEngineParams(repeats=2, phase_s=6.0))
    names = [c.name for c in configs(P)]
    assert data["order"] == [f"{n}/0" for n in names] + [f"{n}/1" for n in names[::-1]]
    res = run_lab("cross-engine", P, "sim")
    d = json.loads(res.record.to_json())
    assert d["verdict"] == "supported", [c for c in res.tables["checks"]]
    assert len(res.tables["checks"]) == 2
    assert "| 4 | only vLLM's prefix cache" in res.markdown
