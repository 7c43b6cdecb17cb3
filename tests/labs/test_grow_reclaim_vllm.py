"""grow-reclaim on a real vLLM, its report on canned runs (no vLLM here): the checks and the
verdict follow the numbers; the lab routes engine=vllm to its runner and refuses in one line
where no vLLM is importable."""

from __future__ import annotations

import copy

import pytest

from workbench.errors import ConfigError
from workbench.labs.grow_reclaim.report import SEED_LINKS, real_checks, vllm_report

MiB = 1 << 20
PAGE = 4 * MiB
BPP = 32
# (phase, requests, [(used pages, reserved pages, held blocks)] sampled in it)
PLAN = [("idle-0", 0, [(1, 1, 0)] * 3),
        ("short", 16, [(1, 1, 0), (2, 1, 40), (3, 1, 64), (1, 2, 0)]),
        ("long", 16, [(1, 2, 0), (5, 1, 130), (8, 1, 224), (1, 2, 0)]),
        ("idle-1", 0, [(1, 2, 0)] * 3),
        ("short-again", 16, [(1, 2, 0), (3, 1, 64), (1, 2, 0)]),
        ("idle-2", 0, [(1, 2, 0)] * 3)]


def canned(device: str = "cpu", free_per_page: int = PAGE) -> dict:
    """A run as grow_reclaim.server returns it: device free falls by what is mapped."""
    samples, phases, t = [], [], 0.0
    for name, n, looks in PLAN:
        start = t
        for used, res, blocks in looks:
            mapped = (used + res) * PAGE
            samples.append({"t": t, "phase": name, "mapped": mapped, "used": used * PAGE,
                            "reserved": res * PAGE, "used_blocks": blocks,
                            "free": 10_000 * MiB - mapped // PAGE * free_per_page})
            t += 0.5
        phases.append({"phase": name, "requests": n, "prompt_tokens": 96, "output_tokens": 32,
                       "start_s": start, "end_s": t, "finished": n, "lost": [],
                       "end": dict(samples[-1])})
    return {"backend": "host" if device == "cpu" else "gpu", "device": device,
            "page_id_bytes": PAGE, "block_size": 32, "capacity": 1 << 30,
            "min_reserved_pages": 1, "max_reserved_pages": 2, "prefix_caching": False,
            "blocks_per_page": BPP, "phases": phases, "samples": samples, "counters": {},
            "summary": {}}


def test_a_run_that_follows_the_seed_is_supported_and_shows_each_link_once():
    rec, md = vllm_report(canned())
    assert rec.verdict.startswith("supported"), rec.verdict
    c = rec.kv["checks"]
    assert c["live_unmaps"] == 0 and c["d_mapped"] == 6 * PAGE and c["d_free"] == 6 * PAGE
    for text, _ in SEED_LINKS:
        assert md.count(f"| {text} |") == 1
    assert "| long | 16 | 16 |" in md and "reported only (host MemAvailable" in md
    (long,) = [r for r in rec.results["phases"] if r["phase"] == "long"]
    assert long["peak_mapped_mib"] == 36.0 and long["end_mapped_mib"] == 12.0
    assert long["peak_used_mib"] == 32.0 and long["end_retired_mib"] == 0.0
    assert rec.cache_state.startswith("prefix cache off")


def test_a_page_with_live_blocks_gone_refutes_only_empty_pages_go_back():
    out = canned()
    bad = next(s for s in out["samples"] if s["used_blocks"] == 224)
    bad["used"] -= 2 * PAGE  # 224 blocks + the null block need 8 pages; 6 are in use
    c = real_checks(out)
    assert c["live_unmaps"] == 1 and c["bad_samples"] == [bad]
    rec, md = vllm_report(out)
    assert rec.verdict.startswith("refuted") and "only wholly empty pages" in rec.verdict
    assert "(1 samples broke it)" in md


def test_mapped_memory_kept_when_idle_refutes_the_return():
    out = canned()
    for s in out["samples"]:
        if s["phase"] == "idle-1":
            s["mapped"] += 6 * PAGE  # the long phase's pages still mapped (e.g. retired)
    for r in out["phases"]:
        r["end"] = [s for s in out["samples"] if s["phase"] == r["phase"]][-1]
    assert not real_checks(out)["returns_in_idle"]
    rec, md = vllm_report(out)
    assert "mapped bytes fall" in rec.verdict and "24 MiB still retired when idle" in rec.verdict
    (idle,) = [r for r in rec.results["phases"] if r["phase"] == "idle-1"]
    assert idle["end_retired_mib"] == 24.0


def test_a_load_the_reserve_absorbed_is_named_and_not_held_against_the_return():
    # SGLang on the H200: short-again never mapped past the reserve it started with
    out = canned()
    for s in out["samples"]:
        if s["phase"] == "short-again":
            s["used"], s["reserved"], s["mapped"] = PAGE, PAGE, 3 * PAGE
    for r in out["phases"]:
        r["end"] = [s for s in out["samples"] if s["phase"] == r["phase"]][-1]
    c = real_checks(out)
    assert c["returns_in_idle"] and c["absorbed_by_reserve"] == ["short-again"]
    rec, md = vllm_report(out)
    assert "| requests end -> block ids freed or cached -> mapped bytes fall | yes; " \
           "short-again stayed within the reserve: nothing above it to return |" in md
    for s in out["samples"]:  # and a long phase that never grew leaves nothing to judge by
        if s["phase"] == "long":
            s["used"], s["reserved"], s["mapped"] = PAGE, 2 * PAGE, 3 * PAGE
    assert not real_checks(out)["returns_in_idle"]


def test_a_lost_request_and_a_reserve_past_its_max_are_named():
    out = canned()
    out["phases"][2]["finished"] = 15
    out["samples"][5]["reserved"] = 3 * PAGE
    rec, _ = vllm_report(out)
    assert "no request lost" in rec.verdict and "at most max_reserved_pages" in rec.verdict


def test_device_free_is_judged_on_gpu_only():
    frozen = canned("cpu", free_per_page=0)  # free memory did not move at all
    assert vllm_report(frozen)[0].verdict.startswith("supported")
    on_gpu = canned("cuda", free_per_page=0)
    rec, md = vllm_report(on_gpu)
    assert "device free follows mapped" in rec.verdict
    assert "| device free memory moves by the mapped delta (long peak -> idle-1) | device " \
           "free moved +0 MiB for 24 MiB unmapped: NO |" in md
    assert vllm_report(canned("cuda"))[0].verdict.startswith("supported")


def test_the_lab_routes_engine_vllm_to_its_runner(monkeypatch):
    from workbench.engines.real.vllm import VllmEngine
    from workbench.labs import get_lab
    from workbench.labs.grow_reclaim import server as runner

    lab = get_lab("grow-reclaim")
    assert {"sim", "host", "gpu"} <= set(lab.backends)
    monkeypatch.setattr(VllmEngine, "interpreter",
                        classmethod(lambda cls, what: "python-with-vllm"))
    monkeypatch.setattr(runner, "run",
                        lambda backend, quick=False, kind="vllm", runner=None:
                        copy.deepcopy(canned()))
    res = lab.run(lab.parse_params({"engine": "vllm", "quick": "true"}), "host")
    assert res.record.verdict.startswith("supported")
    assert res.record.environment["engine"] == "vllm" and res.record.raw_data["wall_s"] >= 0
    assert res.record.results["phases"][0]["phase"] == "idle-0"


def test_engine_vllm_without_vllm_is_refused_in_one_line(monkeypatch):
    from workbench.engines.real import vllm as kind
    from workbench.labs import get_lab, run_lab

    monkeypatch.setattr(kind, "_has_vllm", lambda python: False)
    monkeypatch.setenv("WORKBENCH_VLLM_PYTHON", "/nonexistent/python")
    lab = get_lab("grow-reclaim")
    with pytest.raises(ConfigError) as err:
        run_lab("grow-reclaim", lab.params(engine="vllm", quick=True), "host")
    assert "make engine-vllm" in str(err.value) and "\n" not in str(err.value)
    lab.check_backend("sim", lab.params())  # on sim engine=vllm is the simulated engine
    with pytest.raises(ConfigError, match="engine=sglang on backend 'sim'"):  # gpu only
        lab.check_backend("sim", lab.parse_params({"engine": "sglang"}))


@pytest.mark.parametrize("quick", [True, False])
def test_every_phase_fits_the_engines_context_and_follows_the_seeds_order(quick):
    from workbench.engines.real.vllm import VllmSpec
    from workbench.labs.grow_reclaim.server import phases
    from workbench.labs.kit.server_rig import prompts

    plan = phases(quick)
    assert [p[0] for p in plan] == ["idle-0", "short", "long", "idle-1", "short-again",
                                    "idle-2"]
    for name, n, plen, out in plan:
        assert (n == 0) == name.startswith("idle")
        if n:
            lens = [len(p) for p in prompts(n, shared=0, tail=plen - 2 * (n - 1), seed=1)]
            assert 0 < min(lens) and max(lens) == plen
            assert plen + out <= VllmSpec(model="m").max_model_len


def test_blocks_per_page_from_vllms_block_size_or_the_one_it_was_given(tmp_path, monkeypatch):
    import json
    from types import SimpleNamespace

    from workbench.engines.real.server import block_bytes
    from workbench.engines.real.vllm import VllmEngine, VllmSpec

    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
         "head_dim": 64, "num_hidden_layers": 2}))
    eng = SimpleNamespace(spec=VllmSpec(model=str(tmp_path), device="cuda"))
    # one 32-token block: 2 (K, V) x 2 layers x 8 heads x 64 x 32 tokens x 2 bytes = 128 KiB
    assert block_bytes(str(tmp_path), 32) == 128 << 10
    eng.cache_config = lambda: {"block_size": "32"}
    assert VllmEngine.blocks_per_page(eng, 4 * MiB) == (32, 32)
    eng.cache_config = lambda: {}  # no label: what it was given
    assert VllmEngine.blocks_per_page(eng, 4 * MiB) == (16, 64)
