"""control-groups lab (seed 000 §14): elastic KV beats the static split in the tail only when
peaks are staggered (the README's workload); with simultaneous peaks the groups tie; an
unlimited prefix cache gives the elasticity back."""

from __future__ import annotations

import pytest

from tests.labs.cli import run_lab_cli
from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab
from workbench.labs.control_groups.lab import ControlGroupsParams
from workbench.labs.control_groups.sim import group_config, workload


@pytest.fixture(scope="module")
def quick():
    return run_lab("control-groups", get_lab("control-groups").params(quick=True), "sim")


def _cells(res, kind: str) -> dict[str, dict]:
    return {r["group"]: r for r in res.tables["cells"] if r["workload"] == kind}


def test_groups_are_one_factor_apart():
    p = ControlGroupsParams()
    cfg = {g: group_config(g, p, {}, 0) for g in "ABCDE"}
    assert cfg["A"].mode == "static" and {cfg[g].mode for g in "BCDE"} == {"elastic"}
    assert not cfg["B"].pool.prealloc and cfg["C"].pool.prealloc
    assert [cfg[g].vllm.enable_prefix_caching for g in "ABCDE"] == [False] * 3 + [True] * 2
    assert cfg["D"].pool.max_cached_tokens == 16000 and cfg["E"].pool.max_cached_tokens == -1


def test_staggered_peaks_help_the_tail_not_the_median(quick):
    c = _cells(quick, "readme")
    assert all(r["finished"] == r["requests"] for r in c.values())
    # elastic (C) vs static (A): many times lower p99, the same median
    assert c["C"]["ttft_p99_vs_A"] > 10
    assert 0.9 < c["C"]["ttft_p50_vs_A"] < 1.1
    assert c["A"]["preemptions"] > 0 and c["C"]["preemptions"] == 0
    assert c["C"]["slo_attainment"] > c["A"]["slo_attainment"]
    # preallocation takes VMM latency off the step path
    assert c["B"]["step_vmm_s"] > 5 * c["C"]["step_vmm_s"]
    # an unlimited cache on random prompts holds pages nobody reuses or can borrow
    assert c["E"]["prefix_hit_tokens"] == 0
    assert c["E"]["ttft_ms"]["p99"] > c["A"]["ttft_ms"]["p99"]
    assert c["E"]["preemptions"] > c["A"]["preemptions"]


def test_simultaneous_peaks_leave_nothing_to_lend(quick):
    s = _cells(quick, "simultaneous")
    for g in "BCDE":
        assert 0.8 < s[g]["ttft_p99_vs_A"] < 1.25, (g, s[g]["ttft_p99_vs_A"])
    assert all(r["preemptions"] > 0 for r in s.values())
    assert quick.record.verdict.startswith("supported")


def test_shared_prefix_lets_the_bounded_cache_hit():
    lab = get_lab("control-groups")
    rows = run_lab("control-groups", lab.params(peak=8, workloads=("shared_prefix",)),
                   "sim").tables["cells"]
    c = {r["group"]: r for r in rows}
    hits = c["D"]["prefix_hit_tokens"] / c["D"]["prompt_tokens"]
    assert 0.5 < hits < 0.75  # 192 of 256 prompt tokens shared, the first request misses
    assert c["A"]["prefix_hit_tokens"] == c["C"]["prefix_hit_tokens"] == 0
    assert c["D"]["ttft_ms"]["p50"] < c["C"]["ttft_ms"]["p50"]


def test_workloads_keep_the_ramp_arrivals():
    readme, simul, shared = (workload(k, 12, 0) for k in
                             ("readme", "simultaneous", "shared_prefix"))
    assert [len(w) for w in readme] == [len(w) for w in shared]
    assert [r.arrival for r in readme[1]] == [r.arrival for r in shared[1]]
    assert readme[1][0].arrival > 0 and all(w[0].arrival == simul[0][0].arrival for w in simul)
    assert len({tuple(w[0].prompt[:192]) for w in shared}) == 3
    assert all(r.prompt[:192] == shared[0][0].prompt[:192] for r in shared[0])
    with pytest.raises(ConfigError, match="not a workload"):
        workload("bursty", 12, 0)


def test_cli_runs_the_lab(tmp_path):
    out = tmp_path / "g.json"
    d = run_lab_cli(out, "control-groups", peak="6", workloads="readme")
    assert [r["group"] for r in d["results"]["cells"]] == list("ABCDE")
