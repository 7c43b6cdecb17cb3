"""idle-footprint on a real vLLM, its report on canned runs (no vLLM here): the checks and the
verdict follow the numbers, the page-aware variant is said to be the simulator's only, and the
lab routes engine=vllm to its runner or refuses in one line."""

from __future__ import annotations

import copy

import pytest

from workbench.errors import ConfigError
from workbench.labs.idle_footprint.report import EXPECTED, markdown, real_checks, vllm_report

MiB = 1 << 20
PAGE = 4 * MiB


def row(name: str, bound: int, cached: int, in_use: int) -> dict:
    floor = -(-(cached + 1) // 32)
    return {"engine": name, "eviction": "LRU (least recently freed)" if bound >= 0 else "none",
            "max_cached_tokens": bound * 32 if bound >= 0 else -1, "bound_blocks": bound,
            "requests": 48, "finished": 48, "blocks_per_page": 32, "page_id_bytes": PAGE,
            "block_size": 32, "mapped": in_use * PAGE, "used": in_use * PAGE, "reserved": 0,
            "cached_blocks": cached, "in_use_pages": in_use, "reserved_pages": 0,
            "floor_pages": floor, "ratio_in_use": round(in_use / floor, 3),
            "ratio_mapped": round(in_use / floor, 3), "prefix_hit_tokens": 3000,
            "prefix_query_tokens": 9000}


def canned(reset: dict | None = None) -> dict:
    free = row("if-unbounded", -1, 170, 6)
    free["after_reset"] = reset if reset is not None else {
        "offered": True, "mapped": PAGE, "used": PAGE, "cached_blocks": 0}
    return {"backend": "host", "device": "cpu", "rows": [free, row("if-lru", 48, 48, 5)],
            "sim": {"requests": 500, "page_aware": 1.0, "lru": 2.4, "page_aware_pages": 16,
                    "lru_pages": 38, "floor_pages": 16}, "page_aware_in_adapter": False}


def test_what_the_cache_pins_is_reported_beside_the_seeds_expectation():
    rec, md = vllm_report(canned())
    assert rec.verdict.startswith("supported"), rec.verdict
    assert "170 cached blocks pinned 6 pages (1.0x their floor)" in rec.verdict
    assert "under the LRU bound 2.5x" in rec.verdict  # 5 pages for a 2-page floor
    assert "simulator's only (1.0x against LRU 2.4x there)" in rec.verdict
    assert md.count(EXPECTED) == 1 and "Page-aware is not in the adapter" in md
    assert "it evicted 122 blocks and freed 1 pages" in md
    assert "in use 24 -> 4 MiB (mapped 24 -> 4), 0 blocks held" in md
    assert rec.kv["page_aware_in_adapter"] is False and rec.kv["sim_gap"]["lru"] == 2.4
    assert [r["engine"] for r in rec.results["rows"]] == ["if-unbounded", "if-lru"]


def test_the_sim_markdown_keeps_the_same_expectation_text():
    rows = [{"engine": "vllm", "page_aware": pa, "requests": 500, "cached_blocks": 900,
             "in_use_pages": 15, "reserved_pages": 5, "floor_pages": 15, "ratio_in_use": 1.0,
             "ratio_mapped": 1.33} for pa in (True, False)]
    assert markdown(rows).count(EXPECTED) == 1


def test_a_cache_past_its_bound_or_nothing_pinned_is_refuted():
    out = canned()
    out["rows"][1]["cached_blocks"] = 49
    assert not real_checks(out)["the bound holds (LRU)"]
    assert "the bound holds (LRU)" in vllm_report(out)[0].verdict
    out = canned()
    out["rows"][0].update(cached_blocks=0, in_use_pages=1, floor_pages=1)
    rec, _ = vllm_report(out)
    assert rec.verdict.startswith("refuted") and "pin their pages" in rec.verdict


def test_a_reset_that_keeps_blocks_refutes_and_one_not_offered_is_said():
    out = canned({"offered": True, "mapped": 7 * PAGE, "used": 7 * PAGE, "cached_blocks": 170})
    assert "a reset gives the pages back" in vllm_report(out)[0].verdict
    rec, md = vllm_report(canned({"offered": False, "detail": "HTTP 404"}))
    assert rec.verdict.startswith("supported") and "not offered (HTTP 404)" in md


def test_a_lost_request_is_named():
    out = canned()
    out["rows"][1]["finished"] = 47
    rec, md = vllm_report(out)
    assert "no request lost" in rec.verdict and "if-lru: 47/48" in md


def test_the_lab_routes_engine_vllm_to_its_runner(monkeypatch):
    from workbench.engines.real.vllm import VllmEngine
    from workbench.labs import get_lab
    from workbench.labs.idle_footprint import server as runner

    lab = get_lab("idle-footprint")
    assert {"sim", "host", "gpu"} <= set(lab.backends)
    seen = {}
    monkeypatch.setattr(VllmEngine, "interpreter",
                        classmethod(lambda cls, what: "python-with-vllm"))

    def fake(backend, quick=False, seed=0):
        seen.update(backend=backend, quick=quick, seed=seed)
        return copy.deepcopy(canned())

    monkeypatch.setattr(runner, "run", fake)
    lab.check_backend("host", lab.params(engine="vllm"))
    res = lab.run(lab.parse_params({"engine": "vllm", "quick": "true", "seed": "3"}), "host")
    assert seen == {"backend": "host", "quick": True, "seed": 3}
    assert res.record.verdict.startswith("supported") and res.record.raw_data["wall_s"] >= 0


def test_engine_vllm_without_vllm_is_refused_in_one_line(monkeypatch):
    from workbench.engines.real import vllm as kind
    from workbench.labs import get_lab, run_lab

    monkeypatch.setattr(kind, "_has_vllm", lambda python: False)
    monkeypatch.setenv("WORKBENCH_VLLM_PYTHON", "/nonexistent/python")
    lab = get_lab("idle-footprint")
    with pytest.raises(ConfigError) as err:
        run_lab("idle-footprint", lab.params(engine="vllm", quick=True), "host")
    assert "make engine-vllm" in str(err.value) and "\n" not in str(err.value)
    lab.check_backend("sim", lab.params())


def test_the_wave_shares_prefixes_and_fits_the_engines_context():
    from workbench.engines.real.vllm import VllmSpec
    from workbench.labs.idle_footprint.server import wave

    work = wave(48, seed=0)
    assert wave(48, seed=0) == work and wave(48, seed=1) != work
    heads = {tuple(p[:128]) for p, _ in work}
    assert 1 < len(heads) <= 4  # a few shared prefixes: prefix hits
    assert max(len(p) + k for p, k in work) <= VllmSpec(model="m").max_model_len
    assert all(16 <= k <= 64 for _, k in work)
