"""baseline lab (seed 003 E1): as the open-loop rate rises, latency stays flat then queueing
takes over and throughput plateaus; the knee and the saturation rate follow the stated rules."""

from __future__ import annotations

import pytest

from tests.labs.cli import run_lab_cli
from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab
from workbench.labs.baseline.sim import knee, sweep


@pytest.fixture(scope="module")
def quick():
    return run_lab("baseline", get_lab("baseline").params(quick=True), "sim")


def test_latency_rises_and_throughput_plateaus(quick):
    rows = quick.tables["rates"]
    assert [r["rate"] for r in rows] == [1.0, 3.0, 5.0, 8.0]
    assert all(r["finished"] == r["requests"] == 400 for r in rows)
    for key in ("ttft_ms", "tpot_ms", "queue_ms"):
        p99 = [r[key]["p99"] for r in rows]
        assert p99 == sorted(p99), (key, p99)
    first, last = rows[0], rows[-1]
    assert last["ttft_ms"]["p50"] > 50 * first["ttft_ms"]["p50"]  # queueing, not prefill
    # throughput follows the offered rate at first, then falls behind it
    per_req = [r["output_tok_per_s"] / r["rate"] for r in rows]
    assert per_req[-1] < 0.75 * per_req[0]
    assert last["output_tok_per_s"] > first["output_tok_per_s"]


def test_knee_and_saturation_follow_the_rules(quick):
    rows = quick.tables["rates"]
    for r in rows:
        assert r["stable"] == (r["slo_attainment"] >= 0.9)
        assert r["saturated"] == (r["steady_ratio"] < 0.9)
    assert rows[0]["stable"] and not rows[0]["saturated"]
    assert rows[-1]["saturated"] and not rows[-1]["stable"]
    k = knee(rows)
    assert k == quick.record.results["knee"]
    assert k["knee_rate"] == max(r["rate"] for r in rows if r["stable"])
    assert k["saturation_rate"] == min(r["rate"] for r in rows if r["saturated"])
    assert k["knee_rate"] <= k["saturation_rate"] < rows[-1]["rate"] + 1
    assert "Seed's expected result" in quick.markdown and "**Knee**" in quick.markdown


def test_repeats_alternate_the_order_and_pool_requests():
    lab = get_lab("baseline")
    rows = sweep(lab.params(workload="short", rates=(10.0, 40.0), num_requests=60, repeats=2))
    assert [r["requests"] for r in rows] == [120, 120]  # two repeats pooled
    for r, positions in zip(rows, ([0, 1], [1, 0]), strict=True):
        assert [x["seed"] for x in r["repeats"]] == [0, 1]
        assert [x["position"] for x in r["repeats"]] == positions
        assert r["req_per_s"] == pytest.approx(
            sum(x["req_per_s"] for x in r["repeats"]) / 2, abs=1e-3)


def test_bad_workload_is_refused_before_running():
    lab = get_lab("baseline")
    with pytest.raises(ConfigError, match="workload=huge: not a known choice.*short, long_in"):
        lab.run(lab.params(workload="huge"))


def test_cli_runs_the_lab(tmp_path):
    out = tmp_path / "b.json"
    d = run_lab_cli(out, "baseline", workload="short", rates="10,60", num_requests="80",
                    repeats="1")
    assert [r["rate"] for r in d["results"]["rates"]] == [10.0, 60.0]
    assert d["samples"]["requests_per_rate"] == 80
