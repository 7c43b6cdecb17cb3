"""output-equality (seed 000 §13) on the host backend: elastic KV must give static KV's greedy
tokens exactly, and the layout canary must flag exactly the views that disagree with the
geometry -- including a wrong layout whose tokens stay identical."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the host VMM device needs Linux memfd")

from workbench.errors import ConfigError  # noqa: E402
from workbench.labs import run_lab  # noqa: E402
from workbench.labs.output_equality.lab import OutputEqualityParams  # noqa: E402
from workbench.labs.output_equality.mini import (  # noqa: E402
    POOL,
    WIDE,
    Bench,
    canary,
    first_difference,
    make_prompts,
    run_all,
    wrong_views,
)
from workbench.labs.output_equality.report import EXPECTED_CANARY, checks, tables  # noqa: E402


@pytest.fixture(scope="module")
def out() -> dict:
    return run_all(OutputEqualityParams(quick=True), "host")


def _case(out: dict, name: str) -> dict:
    return next(r for r in out["rows"] if r["case"] == name)


def test_elastic_tokens_are_static_tokens(out):
    for name in ("elastic", "elastic, token layout", "elastic, pages recycled",
                 "elastic, under pressure"):
        r = _case(out, name)
        assert r["equal"] and r["first_difference"] == [None] * 4, name
    assert _case(out, "elastic, pages recycled")["unmaps"] > 0  # wave 2 ran on remapped pages
    pressure = _case(out, "elastic, under pressure")
    assert pressure["preemptions"] == pressure["ref_preemptions"] > 0  # same schedule, recompute


def test_dense_differences_are_near_ties(out):
    dense = _case(out, "paged vs dense")
    diffs = [d for d in dense["first_difference"] if d is not None]
    assert len(dense["near_tie_gaps"]) == len(diffs)
    assert all(0 <= g <= 1 / 64 for g in dense["near_tie_gaps"])


def test_canary_flags_every_wrong_layout_and_only_those(out):
    by = {c["layout"]: c for c in out["canaries"]}
    assert by["none"]["canary_wrong"] == 0 and by["none"]["equal"]
    for layout in ("v-aliases-k", "layers-alias", "block-stride-half"):
        assert not by[layout]["equal"] and by[layout]["canary_wrong"] > 0, layout
    permuted = by["layers-permuted"]  # self-consistent: tokens cannot see it, the canary can
    assert permuted["equal"] and permuted["canary_wrong"] == permuted["canary_checked"]
    assert out["elastic_canary"] == {"checked": 32, "wrong": 0}
    assert all(checks(out, tables(out)).values())
    assert set(by) == set(EXPECTED_CANARY)


@pytest.mark.parametrize("layer", [0, 1])
def test_canary_counts_exactly_the_corrupted_pairs(layer):
    """Only one layer's V laid over its K: the canary finds that layer's K and V blocks wrong
    (K holds V's marks, V's true place holds none) and every other pair right."""
    bench = Bench("tiny", "cpu", WIDE)
    eng = bench.engine("static", kv_bytes=POOL)
    try:
        k, v = wrong_views(eng.kv, "none")
        v = list(v)
        v[layer] = k[layer]
        got = canary(eng.kv, (k, v), blocks=5)
        assert got == {"checked": 2 * 2 * 5, "wrong": 2 * 5}
    finally:
        eng.close()


@given(st.lists(st.integers(0, 3), max_size=8), st.lists(st.integers(0, 3), max_size=8))
def test_first_difference_is_the_first_unequal_position(a, b):
    (d,) = first_difference([a], [b])
    if a == b:
        assert d is None
    else:
        assert a[:d] == b[:d] and (d == min(len(a), len(b)) or a[d] != b[d])


def test_prompts_are_seeded():
    assert make_prompts(512, 3, 1) == make_prompts(512, 3, 1) != make_prompts(512, 3, 2)
    assert [len(p) for p in make_prompts(512, 3, 0)] == [16, 48, 80]


def test_sim_is_refused_before_running():
    with pytest.raises(ConfigError, match="host or gpu"):
        run_lab("output-equality", OutputEqualityParams(quick=True), "sim")


def test_stock_beside_an_elastic_engine_under_a_limit_gets_the_limits_whole_page_ids():
    """Recompute after a preemption is not bit-equal to incremental decode, so the reference
    for the small elastic engine is stock given what its limit leaves: whole page ids, in the
    kind's unit (vLLM blocks; SGLang token slots, a page of ``size`` each)."""
    import types

    from workbench.labs.output_equality import server as oe
    from workbench.units import MiB

    def elastic(limit: int, size: int, per_page: int, seg: bool = True):
        info = types.SimpleNamespace(limit=limit, page_id_bytes=4 * MiB)
        return types.SimpleNamespace(
            name="oe-small-elastic",
            kv_pool=types.SimpleNamespace(info=lambda: info if seg else None),
            blocks_per_page=lambda page_id_bytes: (size, per_page))

    vllm, sglang = oe._vllm_kw(False, 8), oe._sglang_kw(False, 8)
    assert oe.at_limit(elastic(4 * MiB, 16, 64), vllm) == 64  # one page id of 64 blocks
    assert oe.at_limit(elastic(9 * MiB, 16, 64), vllm) == 128  # a part page id backs nothing
    assert oe.at_limit(elastic(16 * MiB, 1, 256), sglang) == 1024  # 4 page ids x 256 slots
    assert oe.at_limit(elastic(8 * MiB, 4, 64), sglang) == 512  # pages of 4 slots
    with pytest.raises(RuntimeError, match="oe-small-elastic published no pool segment"):
        oe.at_limit(elastic(4 * MiB, 16, 64, seg=False), vllm)
