"""prefix-bound (seed 000 §9, seed 003 E4): the cache bound trades idle pages for hits; reuse is
exact-prefix and block-granular; a deeper hit computes less and answers sooner. The checks read
the raw runs (per request and per sample), not the lab's verdict."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from workbench.labs import run_lab
from workbench.labs.prefix_bound.lab import PrefixBoundParams
from workbench.labs.prefix_bound.sim import group_bounds, sweep

P = PrefixBoundParams(quick=True, repeats=1, seed=5)


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def data(request) -> tuple[PrefixBoundParams, dict]:
    p = replace(P, engine=request.param)
    return p, sweep(p)


def _reqs(run: dict) -> list[dict]:
    return run["instances"][0]["requests"]


def _idle_end(run: dict) -> dict:
    name = run["instances"][0]["name"]
    tl = run["timeline"][name]
    end = next(w for w in run["windows"][name] if w["name"] == "idle")["end"]
    i = max(j for j, t in enumerate(tl["t"]) if t < end - 1e-9)
    return {k: v[i] for k, v in tl.items()}


def test_reuse_and_idle_pages_follow_the_bound(data):
    p, d = data
    runs = {b: d["classes"][b][p.seed] for b in (-1, 0, p.bounded)}
    reuse = {b: sum(r["hit_tokens"] for r in _reqs(x)) for b, x in runs.items()}
    assert reuse[-1] > reuse[p.bounded] >= reuse[0]
    idle = {b: _idle_end(x) for b, x in runs.items()}
    assert all(i["running"] == 0 for i in idle.values())
    assert idle[0]["in_use_pages"] == 1 and idle[0]["used_blocks"] == 0  # nothing kept
    assert idle[-1]["in_use_pages"] > idle[p.bounded]["in_use_pages"] > 1
    bs, bpp = runs[-1]["block_size"], runs[-1]["blocks_per_page"]
    assert idle[p.bounded]["cached_blocks"] * bs <= p.bounded
    for i in idle.values():  # what stays in use when idle is the cache, packed into pages
        assert i["used_blocks"] == i["cached_blocks"]
        assert i["in_use_pages"] >= math.ceil((i["used_blocks"] + 1) / bpp)
    assert runs[-1]["instances"][0]["evicted_tokens"]["cap"] == 0
    assert runs[0]["instances"][0]["evicted_tokens"]["cap"] > 0


def test_unique_requests_never_hit(data):
    p, d = data
    for runs in d["classes"].values():
        for r in _reqs(runs[p.seed]):
            if r["group"].startswith("unique"):
                assert r["hit_tokens"] == 0


def test_bound_zero_hits_only_from_a_running_sharer(data):
    p, d = data
    reqs = _reqs(d["classes"][0][p.seed])
    hits = [r for r in reqs if r["hit_tokens"]]
    assert hits  # live sharing does happen at this rate
    for r in hits:
        live = [o for o in reqs if o["group"] == r["group"] and o is not r
                and o["admitted"] <= r["admitted"] < o["finish"]]
        assert live, r


def test_groups_hit_depth_is_block_granular_and_bounded(data):
    p, d = data
    for b in group_bounds(p):
        g = d["groups"][b][p.seed]
        for r in _reqs(g["run"]):
            m = g["meta"][r["rid"]]
            assert r["hit_tokens"] % 16 == 0 and r["hit_tokens"] <= m["expected_hit"]
            if b == -1:
                assert r["hit_tokens"] == m["expected_hit"]
            if b == 0:
                assert r["hit_tokens"] == 0
            if b == p.doc_bound:
                assert r["hit_tokens"] <= p.doc_bound
            if m["group"] == "A" and r["hit_tokens"] == m["expected_hit"]:
                assert r["prompt_len"] - r["hit_tokens"] == 64  # the question is still computed


def test_deeper_hit_means_shorter_ttft(data):
    p, d = data
    probes = [r for b in group_bounds(p) for r in _reqs(d["groups"][b][p.seed]["run"])
              if d["groups"][b][p.seed]["meta"][r["rid"]]["group"] != "warm"]
    same_len = [r for r in probes if r["prompt_len"] == p.doc_len + 64]
    depths = {r["hit_tokens"] for r in same_len}
    assert len(depths) >= 3
    for a in same_len:
        for b in same_len:
            if a["hit_tokens"] > b["hit_tokens"]:
                assert a["ttft"] < b["ttft"]


def test_lab_record():
    res = run_lab("prefix-bound", PrefixBoundParams(quick=True), "sim")
    d = json.loads(res.record.to_json())
    assert d["verdict"] == "supported"
    assert {r["bound"] for r in res.tables["probes"]} == {-1, 0, 8192, 512}
    assert len(res.tables["checks"]) == 2
    assert "| 512 tokens | A | 1024 |" in res.markdown
