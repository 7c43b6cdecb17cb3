"""The colocation lab's repeats on ``host`` (tiny model): the mode order alternates by repeat,
each repeat's raw JSON is written as the sweep goes, the points' medians and ranges are those of
the repeats, and a report rebuilt from the files (``from_dir``) equals the live one."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")

from workbench.labs import get_lab, run_lab  # noqa: E402
from workbench.labs.colocation.mini import run_diagnostics  # noqa: E402
from workbench.labs.colocation.params import load_repeats, spread  # noqa: E402
from workbench.mini.colocation import ColoConfig  # noqa: E402


def test_mode_order_alternates_by_repeat_index():
    cfg = ColoConfig()
    assert [cfg.mode_order(r) for r in range(4)] == [
        ("static", "elastic"), ("elastic", "static"), ("static", "elastic"),
        ("elastic", "static")]


def test_spread_is_median_and_range():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert spread([4.0, 1.0]) == {"median": 2.5, "min": 1.0, "max": 4.0}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="host VMM device needs Linux")
def test_repeats_alternate_write_json_and_summarise(tmp_path):
    lab = get_lab("colocation")
    params = lab.params(model="tiny", budget_gib=0.05, peaks=(1,), time_scale=8, prompt_len=16,
                        completion_len=32, repeats=2, first_repeat=1, out_dir=str(tmp_path))
    res = run_lab("colocation", params, "host")
    reps = load_repeats(tmp_path)
    assert [r["repeat"] for r in reps] == [1, 2]
    # repeat 1 ran elastic first, repeat 2 static first: the file keeps the run order
    assert list(reps[0]["runs"]) == ["1/elastic", "1/static"]
    assert list(reps[1]["runs"]) == ["1/static", "1/elastic"]
    assert res.record.samples["runs_per_point"] == 2
    assert res.record.samples["order"] == {"1": ["elastic", "static"], "2": ["static", "elastic"]}
    (p,) = res.tables["points"]
    assert p["repeats"] == 2
    for mode in ("static", "elastic"):
        means = [r["runs"][f"1/{mode}"]["overall"]["ttft"]["mean"] for r in reps]
        sp = p["mean_ttft_spread_ms"][mode]
        assert sp["min"] == round(min(means) * 1e3, 1) and sp["max"] == round(max(means) * 1e3, 1)
        assert p["mean_ttft_ms"][mode] == round(sum(means) / 2 * 1e3, 1)
    ratios = sorted(r["runs"]["1/static"]["overall"]["ttft"]["p99"]
                    / r["runs"]["1/elastic"]["overall"]["ttft"]["p99"] for r in reps)
    assert p["p99_speedup_spread"]["min"] == round(ratios[0], 2)
    assert p["p99_speedup_spread"]["max"] == round(ratios[1], 2)
    for r in reps:  # raw data the calibration and the diagnosis read
        run = r["runs"]["1/elastic"]
        n_req = run["overall"]["requests"]
        assert len(run["requests"]) == n_req and all(len(q) == 4 for q in run["requests"])
        assert len(run["steps"]) == run_diagnostics(run)["steps"] > 0
        assert all(len(s) == 9 for s in run["steps"])
        assert len(run["preemptions"]) == 3
        assert sum(run["preemptions"]) == run["overall"]["preemptions"]
    again = run_lab("colocation", lab.params(from_dir=str(tmp_path)), "host")
    assert again.tables["points"] == res.tables["points"]
    assert json.loads(again.record.to_json())["samples"] == json.loads(
        res.record.to_json())["samples"]


def _summary(mean: float, p99: float) -> dict:
    return {"ttft": {"mean": mean, "p50": mean, "p99": p99}, "tpot": {"mean": 0.05},
            "preemptions": 0}


def test_points_pair_speedups_by_repeat_and_verdict():
    from workbench.labs.colocation.lab import _verdict, make_points
    from workbench.labs.colocation.params import ColocationRun

    overall = {(1, "static"): [_summary(0.10, 0.2), _summary(0.12, 0.2), _summary(0.30, 0.2)],
               (1, "elastic"): [_summary(0.10, 0.2), _summary(0.10, 0.4), _summary(0.10, 0.1)],
               (6, "static"): [_summary(4.0, 8.0)] * 3,
               (6, "elastic"): [_summary(1.0, 1.0), _summary(2.0, 1.0), _summary(1.0, 4.0)]}
    run = ColocationRun(backend="gpu", peaks=[1, 6], overall=overall, title="t", setup=[],
                        footer=[], record={}, time_scale=4.0)
    low, high = make_points(run)
    assert low["repeats"] == 3 and low["effective_peak_rps"] == 4.0
    # speedups pair repeat i of static with repeat i of elastic: 1.0, 1.2, 3.0
    assert low["mean_speedup_spread"] == {"median": 1.2, "min": 1.0, "max": 3.0}
    assert low["mean_speedup"] == 1.2 and low["p99_speedup_spread"]["min"] == 0.5
    assert high["mean_speedup"] == 4.0 and high["mean_speedup_spread"]["min"] == 2.0
    assert high["mean_ttft_spread_ms"]["elastic"] == {"median": 1000.0, "min": 1000.0,
                                                      "max": 2000.0}
    assert _verdict(run, [low, high]).startswith("Supported on gpu: mean TTFT speedup up to 4.0x")
    worse = dict(overall)
    worse[(6, "elastic")] = [_summary(3.0, 8.0)] * 3
    run.overall = worse
    assert _verdict(run, make_points(run)).startswith("Not supported on gpu")


def test_a_simulated_verdict_follows_the_shape_it_prints():
    """Beside kvcached's figures the verdict is a shape claim: supported only when every PEAK's
    mean and p99 speedups agree with kvcached's (both under 1.25x, or within 2x)."""
    from workbench.labs.colocation.lab import _verdict, agrees
    from workbench.labs.colocation.params import ColocationRun
    from workbench.labs.kit.kvcached import KVCACHED

    assert agrees(1.0, 0.9) and agrees(4.0, 6.2) and not agrees(1.0, 6.2)
    assert not agrees(9.4, 2.0) and not agrees(1.3, 3.0)
    run = ColocationRun(backend="sim", peaks=[12, 16], overall={}, title="t", setup=[],
                        footer=[], record={}, time_scale=None)

    def point(peak: int, mean: float, p99: float) -> dict:
        return {"peak": peak, "mean_speedup": mean, "p99_speedup": p99, "repeats": 1,
                "kvcached": {k: KVCACHED[k].get(peak) for k in KVCACHED}}

    same = [point(12, 1.0, 0.95), point(16, 5.0, 20.0)]
    assert _verdict(run, same).startswith("Supported (shape) in simulation: every PEAK agrees")
    off = [point(12, 1.0, 0.95), point(16, 1.0, 0.99)]
    assert _verdict(run, off).startswith("Not supported in simulation: the shape departs from "
                                         "kvcached's at PEAK 16 (mean 1.0x vs 6.2x, p99 0.99x "
                                         "vs 28.2x)")
