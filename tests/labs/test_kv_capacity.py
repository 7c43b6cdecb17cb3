"""kv-capacity lab (seed 003 E2): the geometry predicts what the pool really hands out, and every
difference is a stated rule; concurrency and preemption follow the block-rounded rule; shared
prefix references reach zero while memory stays mapped."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.labs.cli import run_lab_cli
from workbench.engines.models import get_model
from workbench.labs import get_lab, run_lab
from workbench.labs.kv_capacity.sim import CapacityCase, measure


@pytest.fixture(scope="module")
def quick():
    lab = get_lab("kv-capacity")
    return run_lab("kv-capacity", lab.params(quick=True), "sim")


def test_prediction_minus_rules_is_what_the_ledger_hands_out(quick):
    rows = quick.tables["capacity"]
    assert len(rows) == 8 and all(r["fits"] for r in rows)
    for r in rows:
        rules = r["page_floor_blocks"] + r["unaddressed_blocks"] + r["straddle_blocks"] + 1
        assert r["allocatable_blocks"] == r["pred_blocks"] - rules, r
        assert r["explains"] and r["token_slots"] == r["allocatable_blocks"] * r["block_size"]
        # the page floor drops less than one page id's worth of blocks
        assert 0 <= r["page_floor_blocks"] <= math.ceil(r["blocks_per_page"])
        # an elastic pool maps the null block's page and its 5-page reserve before any request
        assert r["mapped_page_ids_idle"] == (6 if r["mode"] == "elastic" else 1)


def test_divisible_geometry_is_exact_and_mla_straddles(quick):
    llama = [r for r in quick.tables["capacity"] if r["model"] == "llama-3.1-8b"]
    mla = [r for r in quick.tables["capacity"] if r["model"] == "deepseek-v2-lite"]
    for r in llama:  # 64 blocks of 16 tokens per 2 MiB page: nothing straddles
        assert r["straddle_blocks"] == r["unaddressed_blocks"] == 0
        assert r["advertised_blocks"] == r["allocatable_blocks"]
    for r in mla:  # 113.8 blocks per page: one straddler per page is lost
        assert r["straddle_blocks"] > 0
        assert r["advertised_blocks"] >= r["allocatable_blocks"]
        assert (r["unaddressed_blocks"] > 0) == (r["mode"] == "static")


def test_layout_changes_driver_maps_not_capacity(quick):
    rows = quick.tables["capacity"]
    key = ("model", "mem_gib", "block_size", "mode")
    by = {(tuple(r[k] for k in key), r["layout"]): r for r in rows}
    pairs = [(c, by[(k, "per_layer")]) for (k, lay), c in by.items() if lay == "contiguous"]
    assert len(pairs) == 4
    for c, p in pairs:
        spec = get_model(c["model"])
        assert c["allocatable_blocks"] == p["allocatable_blocks"]
        assert c["maps_per_page"] == 1
        assert p["maps_per_page"] == spec.num_layers * (1 if spec.mla else 2)
        if c["mode"] == "elastic":  # the device really holds that many mappings when full
            assert p["driver_mappings_full"] == p["mapped_page_ids_full"] * p["maps_per_page"]
            assert c["driver_mappings_full"] == c["mapped_page_ids_full"]


def test_concurrency_follows_whole_blocks(quick):
    rows = quick.tables["concurrency"]
    assert [r["context_tokens"] for r in rows] == [100, 1000, 4000, 16000]
    for r in rows:
        assert r["admitted"] == r["block_rule"]
        assert r["naive"] >= r["admitted"]
    short = rows[0]
    assert short["blocks_per_request"] == 7 and short["rounding_tokens"] == 12
    assert short["naive"] > short["admitted"]  # block rounding, not the budget, limits it


def test_preemption_starts_one_past_the_predicted_maximum(quick):
    rows = quick.tables["preemption"]
    assert [r["concurrency"] for r in rows] == [6, 7]
    for r in rows:
        assert r["finished"] == r["concurrency"]
        fits = r["concurrency"] <= r["predicted_max"]
        assert (r["preemptions"] == 0) == fits
        assert (r["recomputed_tokens"] == 0) == fits
    assert rows[0]["predicted_max"] == 6


def test_shared_prefix_refs_reach_zero_while_memory_stays(quick):
    rows = quick.tables["shared_prefix"]
    assert [r["shared_refs"] for r in rows] == [[1], [2], [1], [0], [0]]
    assert [r["used_blocks"] for r in rows] == [5, 6, 5, 4, 0]
    assert [r["evictable"] for r in rows] == [0, 0, 0, 4, 0]
    assert "4 blocks hit" in rows[1]["step"]
    # nothing is unmapped at any step: page 0 holds the null block, the reserve keeps 5 pages
    assert {r["mapped_page_ids"] for r in rows} == {6}
    assert rows[-1]["in_use_page_ids"] == 1


def test_record_and_markdown(quick):
    d = json.loads(quick.record.to_json())
    assert d["experiment_id"] == "kv-capacity-geometry"
    assert d["verdict"].startswith("supported")
    assert "Seed's expected result" in quick.markdown and "Straddlers" in quick.markdown


@settings(max_examples=12, deadline=None)
@given(model=st.sampled_from(["llama-3.1-8b", "qwen3-8b", "deepseek-v2-lite", "tiny"]),
       mem=st.floats(min_value=36.0, max_value=141.0), bs=st.sampled_from([16, 32, 64]),
       mode=st.sampled_from(["static", "elastic"]))
def test_rules_explain_any_pool(model, mem, bs, mode):
    util = 0.9 if mode == "static" else 0.95
    r = measure(CapacityCase(model, round(mem, 2), bs, "contiguous", mode, util, 2.2))
    assert r["fits"]
    assert r["explains"], r
    assert r["allocatable_blocks"] <= r["pred_blocks"] - 1


def test_cli_runs_the_lab(tmp_path):
    out = tmp_path / "kv.json"
    d = run_lab_cli(out, "kv-capacity", "--quick")
    assert len(d["results"]["capacity"]) == 8
    assert out.with_suffix(".md").exists()
