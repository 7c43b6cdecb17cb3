"""chunked-prefill lab (seed 003 E3): with chunking off, long prefills stall the decoding
requests (ITL spikes); with it on, the stall shrinks to about one budget-sized step and the long
prompts' TTFT pays."""

from __future__ import annotations

import pytest

from tests.labs.cli import run_lab_cli
from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab
from workbench.labs.chunked_prefill.sim import sweep
from workbench.labs.kit.serving import mix


@pytest.fixture(scope="module")
def quick():
    return run_lab("chunked-prefill", get_lab("chunked-prefill").params(quick=True), "sim")


def _rows(res) -> dict[str, dict]:
    return {r["config"]: r for r in res.tables["configs"]}


def test_chunking_trades_decode_itl_for_long_ttft(quick):
    rows = _rows(quick)
    assert list(rows) == ["off", "on/512", "on/2048"]
    off, small, mid = rows["off"], rows["on/512"], rows["on/2048"]
    # off: a whole 4096-token prefill in one step stalls every running decode
    assert off["decode_itl_ms"]["p99"] > 3 * small["decode_itl_ms"]["p99"]
    assert off["decode_worst_itl_ms"]["p99"] > 5 * small["decode_worst_itl_ms"]["p99"]
    # the worst gap grows with the budget: about one budget-sized step
    assert small["decode_worst_itl_ms"]["p99"] < mid["decode_worst_itl_ms"]["p99"] < \
        off["decode_worst_itl_ms"]["p99"]
    assert small["smooth_share"] == 1.0 and off["smooth_share"] < 0.5
    # and the long prompts pay: more steps, each carrying decodes and overhead
    assert small["long_ttft_ms"]["p50"] > mid["long_ttft_ms"]["p50"] > off["long_ttft_ms"]["p50"]
    assert small["steps"] > mid["steps"] > off["steps"]
    assert small["mean_step_ms"] < off["mean_step_ms"]
    v = quick.record.results["verdict"]["4"]
    assert v["off_vs"] == "on/512" and v["long_ttft_p50_ratio"] > 1.0
    assert quick.record.verdict.startswith("supported")


def test_every_request_finishes_and_classes_are_split(quick):
    for r in quick.tables["configs"]:
        assert r["long_requests"] + r["decode_requests"] == 400
        assert r["preemptions"] == 0
    reqs = mix(4.0, 400, 0.2, 0)
    assert sum(r.group == "long_in" for r in reqs) == _rows(quick)["off"]["long_requests"]
    assert "Seed's expected result" in quick.markdown


def test_order_alternates_between_repeats():
    lab = get_lab("chunked-prefill")
    rows = sweep(lab.params(budgets=(512,), rates=(2.0,), num_requests=40, repeats=2))
    assert [r["config"] for r in rows] == ["off", "on/512"]
    assert [x["position"] for x in rows[0]["repeats"]] == [0, 1]
    assert [x["position"] for x in rows[1]["repeats"]] == [1, 0]
    assert [x["seed"] for x in rows[0]["repeats"]] == [0, 1]


def test_bad_parameters_are_refused():
    lab = get_lab("chunked-prefill")
    with pytest.raises(ConfigError, match=r"long_share=1.5: outside 0..1"):
        lab.run(lab.params(long_share=1.5, num_requests=10, repeats=1))
    with pytest.raises(ConfigError, match=r"budgets=\(8,\): .*each from 16"):
        lab.run(lab.params(budgets=(8,)))


def test_cli_runs_the_lab(tmp_path):
    out = tmp_path / "c.json"
    d = run_lab_cli(out, "chunked-prefill", budgets="512", rates="3", num_requests="60",
                    repeats="1")
    assert [r["config"] for r in d["results"]["configs"]] == ["off", "on/512"]
