"""pd-split lab (seed 003 E7): at low load PD's TTFT pays the transfer and one decode-side step;
under long-prompt load PD's TPOT tail beats colocated serving (its decode steps carry no prefill
chunks) while its one prefill GPU saturates first, so the SLO decides who wins goodput."""

from __future__ import annotations

import pytest

from tests.labs.cli import run_lab_cli
from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab
from workbench.labs.pd_split.sim import sweep


@pytest.fixture(scope="module")
def quick():
    return run_lab("pd-split", get_lab("pd-split").params(quick=True), "sim")


def _cell(res, share, rate):
    return {r["mode"]: r for r in res.tables["sweep"]
            if r["long_share"] == share and r["rate"] == rate}


def test_low_load_pd_ttft_pays_the_transfer_and_a_tail_step(quick):
    single = quick.record.results["single_request"]
    ph = single["phases_ms"]
    assert ph["prefill_queue"] == ph["link_queue"] == ph["decode_wait"] == 0.0  # nothing queues
    assert ph["transfer"] == pytest.approx(single["link_s_expected_ms"], abs=1e-3)
    assert ph["prefill"] == pytest.approx(single["colocated"]["p50"], rel=1e-3)  # same compute
    assert single["extra_ms"] == pytest.approx(ph["transfer"] + ph["tail"], abs=0.05)
    assert single["extra_ms"] > 0


def test_long_prompt_load_pd_tpot_tail_beats_colocated(quick):
    c = _cell(quick, 0.5, 4.0)
    colo, pd = c["colocated"], c["pd"]
    assert pd["tpot_ms"]["p99"] * 1.5 < colo["tpot_ms"]["p99"]
    assert pd["mixed_steps"]["decode"] == 0 and colo["mixed_steps"]["colocated"] > 100
    assert pd["goodput_streaming"] > 2 * colo["goodput_streaming"]  # tight TPOT: PD wins
    # ...and loses under a loose TPOT bound: its one prefill GPU queues the prompts
    assert pd["ttft_ms"]["p99"] > 2 * colo["ttft_ms"]["p99"]
    assert pd["goodput_interactive"] < colo["goodput_interactive"]
    assert pd["busy"]["prefill"] > 3 * _cell(quick, 0.5, 1.0)["pd"]["busy"]["prefill"]
    v = quick.record.results["verdict"]
    assert "0.5@4" in v["pd_loses_interactive_goodput"] and "0.5@4" in v["pd_lower_tpot_p99"]
    assert quick.record.verdict.startswith("supported")
    assert "Seed's expected result" in quick.markdown


def test_the_starved_side_saturates_first(quick):
    rows = {(r["long_share"], r["split"]): r for r in quick.tables["ratios"]}
    assert {s for _, s in rows} == {"colocated x4", "1:3", "2:2", "3:1"}
    few_p, many_p = rows[(0.5, "1:3")], rows[(0.5, "3:1")]
    # prompt-heavy: one prefill GPU for three decode GPUs queues the prompts
    assert few_p["ttft_ms"]["p99"] > 3 * many_p["ttft_ms"]["p99"]
    assert few_p["busy"]["prefill"] > 2 * many_p["busy"]["prefill"]
    # decode-heavy: one decode GPU batches every decode, so its TPOT is the highest of the splits
    assert rows[(0.1, "3:1")]["tpot_ms"]["p99"] > rows[(0.1, "1:3")]["tpot_ms"]["p99"]
    best = quick.record.results["best_splits"]
    assert best["0.5"]["streaming"] != "1:3" and best["0.1"]["streaming"] != "3:1"
    assert "## P:D ratio on 4 GPUs" in quick.markdown


def test_every_request_finishes_in_both_modes(quick):
    assert all(r["finished"] == 150 for r in quick.tables["sweep"])
    assert {r["mode"] for r in quick.tables["sweep"]} == {"colocated", "pd"}


def test_order_alternates_between_repeats():
    lab = get_lab("pd-split")
    rows = sweep(lab.params(rates=(2.0,), long_shares=(0.2,), num_requests=30, repeats=2))
    assert [r["mode"] for r in rows] == ["colocated", "pd"]
    assert [x["position"] for x in rows[0]["repeats"]] == [0, 1]
    assert [x["position"] for x in rows[1]["repeats"]] == [1, 0]


def test_bad_parameters_are_refused():
    lab = get_lab("pd-split")
    with pytest.raises(ConfigError, match=r"link_gbps=0.0: outside 0.01"):
        lab.run(lab.params(link_gbps=0.0))
    with pytest.raises(ConfigError, match=r"decode=0: outside 1..16"):
        lab.run(lab.params(decode=0, quick=True))
    with pytest.raises(ConfigError, match="no room for both sides"):
        lab.run(lab.params(ratio_gpus=1, rates=(1.0,), long_shares=(0.1,), num_requests=10,
                           repeats=1))
    with pytest.raises(ConfigError, match="unknown device name"):
        run_lab("pd-split", None, "banana")


def test_cli_runs_the_lab(tmp_path):
    out = tmp_path / "pd.json"
    d = run_lab_cli(out, "pd-split", rates="2", long_shares="0.3", num_requests="40",
                    repeats="1", ratio_gpus="0")
    assert [r["mode"] for r in d["results"]["sweep"]] == ["colocated", "pd"]
