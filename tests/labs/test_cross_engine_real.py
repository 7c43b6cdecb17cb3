"""cross-engine with engine=real (a real vLLM and a real SGLang on the GPU): the report from a
canned run, each broken claim failing its own check; the runner's phases over both stand-in
servers; and the lab's refusals, each one line."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from workbench.errors import ConfigError
from workbench.labs import get_lab
from workbench.labs.cross_engine.real_report import checks, phase_rows, report
from workbench.labs.kit import server_rig as rig
from workbench.units import MiB

BUDGET = 64 * MiB
REAL = Path(__file__).parents[1] / "engines" / "real"


def _row(t, phase, v, s, holders):
    return {"t": t, "phase": phase, "vllm": v * MiB, "sglang": s * MiB, "total": BUDGET,
            "held": sum(holders) * MiB, "holders": {"11": holders[0] * MiB,
                                                    "21": holders[1] * MiB}, "free": 10 << 30}


def canned() -> dict:
    rows = [_row(0, "idle", 4, 2, (4, 2)), _row(1, "vllm", 44, 2, (44, 2)),
            _row(2, "vllm drained", 4, 2, (4, 2)), _row(3, "sglang", 4, 58, (4, 58)),
            _row(4, "sglang drained", 4, 58, (4, 58)), _row(5, "sglang flushed", 4, 2, (4, 2)),
            _row(6, "vllm again", 40, 2, (40, 2)), _row(7, "vllm again drained", 4, 2, (4, 2))]
    ok = {"rc": 0, "budgets": {"gpu": {"total": BUDGET, "held": 6 * MiB, "holders": [
        {"pid": 11, "alive": True, "held": 4 * MiB}, {"pid": 21, "alive": True, "held": 2 * MiB}]}}}
    return {"backend": "gpu", "device": "cuda", "engine": "vllm+sglang", "budget": BUDGET,
            "page_id_bytes": {"vllm": 4 * MiB, "sglang": 2 * MiB}, "in_flight": 32,
            "max_tokens": 128, "phase_s": 10.0, "phases": ["idle", "vllm", "sglang",
                                                           "vllm again"],
            "pids": {"vllm": [10, 11], "sglang": [20, 21]},
            "flush": {"ok": True, "status": 200, "text": "Cache flushed.",
                      "mapped_before": 58 * MiB, "mapped_after": 2 * MiB},
            "requests": {"vllm": 60, "sglang": 30}, "finished": {"vllm": 60, "sglang": 30},
            "lost": [], "counters": {"vllm": {}, "sglang": {}},
            "kvctl_budget": {"idle": ok, "vllm": ok}, "ttft_ms": {}, "samples": rows}


def test_a_run_where_each_maps_what_the_other_released_is_supported():
    rec, md = report(canned())
    assert rec.verdict.startswith("supported"), rec.verdict
    assert rec.environment["engine"] == "vllm+sglang"
    assert md.startswith("# Cross-engine: vLLM and SGLang on one device (real vLLM + real SGLang)")
    assert "58 -> 2 MiB" in md and "90/90 finished in full" in md
    by = {r["phase"]: r for r in rec.results["phases"]}
    assert by["sglang"]["sglang_end_mib"] == 2  # after the flush, not while the cache held
    assert by["vllm again"]["vllm_peak_mib"] == 40


@pytest.mark.parametrize("harm, broken", [
    (lambda o: o["samples"][3].update(held=BUDGET + MiB), "never_above_budget"),
    (lambda o: o["samples"][3].update(vllm=8 * MiB), "never_above_budget"),
    (lambda o: o.update(lost=["timeout"]), "no_request_lost"),
    (lambda o: o["finished"].update(sglang=29), "no_request_lost"),
    (lambda o: o["samples"][2].update(vllm=44 * MiB), "vllm_gives_back"),
    (lambda o: o["samples"][3].update(sglang=16 * MiB), "sglang_maps_what_vllm_released"),
    (lambda o: o["samples"][5].update(sglang=58 * MiB), "sglang_flush_gives_back"),
    (lambda o: o["flush"].update(ok=False), "sglang_flush_gives_back"),
    (lambda o: o["samples"][6].update(vllm=4 * MiB), "vllm_maps_what_sglang_released"),
    (lambda o: o["samples"][0].update(vllm=44 * MiB), "vllm_grows_alone"),
    (lambda o: o["samples"][1]["holders"].update({"99": MiB}), "holders_are_the_engines"),
])
def test_each_broken_claim_fails_its_own_check(harm, broken):
    out = copy.deepcopy(canned())
    harm(out)
    bad = [k for k, ok in checks(out, phase_rows(out)).items() if not ok]
    assert bad == [broken], bad
    assert report(out)[0].verdict.startswith("refuted")


def test_the_runner_walks_its_phases_over_both_stand_ins(monkeypatch, tmp_path):
    from workbench.labs.cross_engine import real

    monkeypatch.setitem(rig.STAND_INS, "vllm", [sys.executable, str(REAL / "fake_server.py")])
    monkeypatch.setitem(rig.STAND_INS, "sglang",
                        [sys.executable, str(REAL / "fake_sglang_server.py")])
    monkeypatch.setattr(rig, "device_of", lambda backend: "cuda")
    monkeypatch.setattr(rig, "device_free", lambda device: 100 << 30)
    monkeypatch.setattr(rig, "model_dir", lambda py, root, kind="vllm": str(tmp_path))
    monkeypatch.setenv("FAKE_TOKEN_S", "0.002")
    out = real.run("gpu", quick=True, phase_s=0.4)
    assert out["phases"] == ["idle", "vllm", "sglang", "vllm again"]
    assert out["flush"]["ok"] and not out["lost"]
    assert out["finished"] == out["requests"] and out["requests"]["sglang"] > 0
    seen = {x["phase"] for x in out["samples"]}
    assert {"vllm", "sglang drained", "sglang flushed", "vllm again"} <= seen
    assert all(x["vllm"] is not None and x["sglang"] is not None for x in out["samples"])


@pytest.mark.parametrize("backend, engine, fix", [
    ("sim", "real", "--backend gpu"), ("gpu", "sim", "engine=real"),
    ("host", "sim", "--backend sim or gpu")])
def test_a_pairing_of_backend_and_engine_it_does_not_run_is_refused(backend, engine, fix):
    lab = get_lab("cross-engine")
    with pytest.raises(ConfigError) as e:
        lab.check_backend(backend, lab.params(engine=engine))
    assert fix in str(e.value) and "\n" not in str(e.value)


def test_engine_real_needs_both_engines(monkeypatch):
    from workbench.engines.real import sglang as sgl_kind

    monkeypatch.setenv("WORKBENCH_SGLANG_PYTHON", "/nonexistent/python")
    monkeypatch.setattr(sgl_kind, "_has_sglang", lambda python: False)
    from workbench.engines.real.vllm import VllmEngine

    monkeypatch.setattr(VllmEngine, "interpreter",
                        classmethod(lambda cls, what: "python-with-vllm"))
    monkeypatch.setattr("workbench.backends.require", lambda backend: backend)
    lab = get_lab("cross-engine")
    with pytest.raises(ConfigError, match="needs a real SGLang"):
        lab.check_backend("gpu", lab.params(engine="real"))
