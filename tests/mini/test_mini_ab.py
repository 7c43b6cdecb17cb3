"""The interleaved VMM/static A/B (``workbench.bench.ab``) on a CPU: tiny model, host VMM device."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")

from workbench.bench.ab import main  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="host VMM device needs Linux")


def test_ab_alternates_rounds_and_reports_ratios(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--model", "tiny", "--device", "cpu",
                 "--decode-rounds", "2", "--batch", "4", "--prompt-len", "16", "--gen", "6",
                 "--kv-gib", "0.01", "--max-batched-tokens", "64", "--ttft-rounds", "2",
                 "--rate", "40", "--requests", "6", "--ttft-prompt-len", "16",
                 "--ttft-gen", "4", "--budget-gib", "0.01"]) == 0
    res = json.loads((tmp_path / "ab.json").read_text())
    assert "decode_error" not in res and "ttft_error" not in res
    d = res["decode"]
    assert [r["backend"] for r in d["runs"]] == ["vmm", "static", "static", "vmm"]
    assert len(d["round_ratios"]) == 2 and d["median_round_ratio"] > 0
    assert all(r["n_full_steps"] > 0 and r["full_tok_s"] > 0 for r in d["runs"])
    t = res["ttft"]
    assert [r["mode"] for r in t["runs"]] == ["elastic", "static", "static", "elastic"]
    assert all(r["finished"] == r["requests"] == 6 for r in t["runs"])
    assert t["median_round_ratio"]["mean"] > 0
    assert any(r["mapped_peak_bytes"] for r in t["runs"] if r["mode"] == "elastic")
    out = capsys.readouterr().out
    assert "decode VMM/static" in out and "ttft elastic/static" in out


def test_ab_stops_at_the_wall_budget(tmp_path):
    assert main(["--out", str(tmp_path), "--model", "tiny", "--device", "cpu",
                 "--parts", "decode", "--decode-rounds", "5", "--batch", "2",
                 "--prompt-len", "8", "--gen", "3", "--kv-gib", "0.01",
                 "--max-batched-tokens", "64", "--max-wall-s", "0"]) == 0
    d = json.loads((tmp_path / "ab.json").read_text())["decode"]
    assert d["runs"] == [] and d["median_round_ratio"] is None


def test_steady_decode_reports_floor_ratios_and_spreads(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--model", "tiny", "--device", "cpu", "--parts",
                 "steady", "--steady-batches", "2,3", "--steady-rounds", "2",
                 "--steady-steps", "2", "--steady-prompt-len", "8", "--kv-gib", "0.01"]) == 0
    res = json.loads((tmp_path / "ab.json").read_text())
    assert "steady_error" not in res
    assert [s["batch"] for s in res["steady"]] == [2, 3]
    for s in res["steady"]:
        # no graphs off CUDA: the eager block subjects only, 2 rounds x 2 steps each
        assert sorted(s["subjects"]) == ["static-block-eager", "vmm-block-eager"]
        for sub in s["subjects"].values():
            assert sub["step_s"]["n"] == 4 and sub["graphed_steps"] == 0
            assert sub["step_s"]["p10"] <= sub["step_s"]["median"] <= sub["step_s"]["p90"]
        r = s["vmm_over_static"]["eager"]
        assert r["n"] == 2 and len(r["rounds"]) == 2 and r["median"] > 0
        assert s["vmm_over_static"]["graphs"]["n"] == 0
        assert s["vmm_over_static"]["graphs-forward"]["n"] == 0  # no CUDA events on a CPU
    out = capsys.readouterr().out
    assert "step/floor" in out and "VMM/static decode (eager)" in out


def test_steady_profile_times_the_host_calls_and_puts_the_methods_back(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--model", "tiny", "--device", "cpu", "--parts",
                 "steady", "--steady-batches", "2", "--steady-rounds", "1", "--steady-steps",
                 "3", "--steady-prompt-len", "8", "--kv-gib", "0.01", "--steady-profile"]) == 0
    s = json.loads((tmp_path / "ab.json").read_text())["steady"][0]
    prof = s["profile"]
    assert prof["device"] is None  # the device parts need CUDA graphs
    host = prof["host"]
    assert set(host) == {"schedule", "sched update", "table update", "step", "forward",
                         "outside forward"}
    assert all(host[k] > 0 for k in ("schedule", "sched update", "table update", "step"))
    assert host["forward"] == 0 and host["outside forward"] == host["step"]
    assert host["schedule"] + host["sched update"] < host["step"]
    # no graphs on a CPU: the half-round ratios are empty as the graphed ones are
    assert s["vmm_over_static"]["graphs-half"]["n"] == 0
    assert "host split of a graphed step" in capsys.readouterr().out


def test_host_split_leaves_no_instance_wrappers():
    from workbench.bench.mini import _engine
    from workbench.bench.steady import _fill
    from workbench.bench.stepprof import host_split
    from workbench.mini.model import build_model, get_config

    cfg = get_config("tiny")
    eng = _engine(build_model(cfg, "cpu"), cfg, "static", "block", 1 << 22, max_num_seqs=2,
                  max_batched_tokens=64)
    try:
        _fill(eng, cfg, 2, 6, 20, salt=0)
        host_split(eng, 2)
        assert len(eng.stats.steps) == 2 and all(s.num_decode == 2 for s in eng.stats.steps)
        for obj, attr in ((eng.scheduler, "schedule"), (eng.scheduler, "update"),
                          (eng.r2t, "update")):
            assert attr not in vars(obj)  # the class's method again
    finally:
        eng.close()
