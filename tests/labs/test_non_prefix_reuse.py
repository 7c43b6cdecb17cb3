"""non-prefix-reuse (seed 003 E9): an exact prefix cache stops at the first changed chunk;
position-free document keys find documents anywhere and blending reuses them at the price of a
recomputed fraction; a document off the chunk grid is not found. Checks read the raw runs."""

from __future__ import annotations

import json
import math

import pytest

from workbench.engines.models import get_model
from workbench.labs import run_lab
from workbench.labs.non_prefix_reuse.lab import NonPrefixReuseParams
from workbench.labs.non_prefix_reuse.sim import CASES, sweep

P = NonPrefixReuseParams(quick=True, repeats=1, seed=4)
KVB = get_model(P.model).kv_bytes_per_token


@pytest.fixture(scope="module")
def data() -> dict:
    return sweep(P)


def _run(d: dict, case: str) -> dict:
    return d["runs"][case][P.seed]


def test_exact_prefix_reuse_ends_at_the_first_change(data):
    docs = P.docs_per_prompt * P.doc_len
    assert _run(data, "same-order")["prefix"]["reused"] == P.preamble_len + docs
    for c in ("reordered", "swapped-doc", "off-grid"):
        assert _run(data, c)["prefix"]["reused"] == P.preamble_len  # the preamble only
    assert _run(data, "new-preamble")["prefix"]["reused"] == 0
    for c in CASES:
        r = _run(data, c)
        assert r["prefix"]["recomputed"] + r["prefix"]["reused"] == r["prompt_len"]
        assert r["prefix"]["bytes"] == r["prefix"]["reused"] * KVB


def test_blend_finds_documents_anywhere_and_pays_the_fraction(data):
    docs = P.docs_per_prompt * P.doc_len
    for c, blended in (("reordered", docs), ("swapped-doc", docs),
                       ("new-preamble", docs + P.preamble_len), ("same-order", 0),
                       ("off-grid", 0)):
        r = _run(data, c)
        for ratio, b in r["blend"].items():
            assert b["blended"] == blended
            fresh = r["prompt_len"] - r["prefix"]["reused"] - blended
            assert b["recomputed"] == fresh + math.ceil(ratio * blended)
            assert b["bytes"] == (r["prefix"]["reused"] + blended) * KVB
        ttfts = [r["blend"][x]["ttft"] for x in sorted(r["blend"])]
        if blended:
            assert ttfts == sorted(ttfts) and len(set(ttfts)) == len(ttfts)
            assert r["blend"][P.recompute_ratio]["ttft"] < r["prefix"]["ttft"]
            assert r["blend"][1.0]["ttft"] > r["full"]["ttft"]  # all recomputed, plus the load
        else:  # nothing to blend: the same as the exact prefix cache
            assert all(math.isclose(t, r["prefix"]["ttft"]) for t in ttfts)


def test_lab_record_says_quality_is_not_measured_on_sim():
    res = run_lab("non-prefix-reuse", NonPrefixReuseParams(quick=True), "sim")
    d = json.loads(res.record.to_json())
    assert d["verdict"] == "supported"
    assert d["correctness"].startswith("quality not measured")
    assert "**Not measured.**" in res.markdown
    assert {r["scheme"] for r in res.tables["cases"]} == {"full", "prefix", "blend 0.15"}


def test_quality_proxy_shrinks_with_the_recomputed_fraction():
    pytest.importorskip("torch")
    from workbench.labs.non_prefix_reuse.mini import RATIOS, measure

    exact = measure("same-order", 1)
    assert all(r["kl"] < 1e-6 and r["top1_agrees"] for r in exact)  # the prefix cache is exact
    rows = measure("reordered", 1)
    kls = [r["kl"] for r in rows]
    assert [r["ratio"] for r in rows] == list(RATIOS)
    assert kls[0] > 1e-4  # documents computed alone miss each other: the output moves
    assert all(a > b for a, b in zip(kls[:-1], kls[1:], strict=True))
    # at 100% every token but the exact 32-token preamble is recomputed: full prefill again
    assert kls[-1] < 1e-6 and rows[-1]["recomputed"] == rows[-1]["tokens"] - 32
