"""The colocation lab's mini-engine code path (its gpu backend) on a CPU: backend ``host``, tiny
model, host VMM device; and the step-time fit on synthetic steps."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch")

from workbench.bench.stepfit import fit_steptime  # noqa: E402
from workbench.core.budget_device import BudgetDevice  # noqa: E402
from workbench.engines.sim.steptime import StepTimeModel  # noqa: E402
from workbench.errors import DeviceError  # noqa: E402
from workbench.labs import get_lab, run_lab  # noqa: E402
from workbench.sim.device import SimDevice  # noqa: E402


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="host VMM device needs Linux")
def test_colocation_runs_both_modes_on_cpu():
    lab = get_lab("colocation")
    params = lab.params(model="tiny", budget_gib=0.05, peaks=(1,), time_scale=8, prompt_len=16,
                        completion_len=32)
    res = run_lab("colocation", params, "host")
    (rep,) = res.record.results["repeats"]
    runs = rep["runs"]
    (p,) = res.tables["points"]
    for mode in ("static", "elastic"):
        o = runs[f"1/{mode}"]["overall"]
        assert o["finished"] == o["requests"] > 0
    assert p["mean_speedup"] > 0 and res.record.results["low_load_overhead"]["peak"] == 1
    assert p["effective_peak_rps"] == 8 and "kvcached" not in p and p["repeats"] == 1
    assert runs["1/elastic"]["budget_peak_bytes"] <= int(0.05 * (1 << 30))
    assert "| 1 (8) |" in res.markdown and "mini engine" in res.markdown
    assert "Where the time went" in res.markdown
    rec = res.record
    assert rec.environment["backend"] == "host" and rec.ttft["static"]["1"][0]["n"] > 0
    assert rec.samples["runs_per_point"] == 1 and rec.samples["order"] == {
        "0": ["static", "elastic"]}
    assert rec.manifest.software["backend"] == "host"


def test_budget_device_refuses_past_the_budget():
    dev = BudgetDevice(SimDevice("h200"), 4 << 20)
    h = dev.create(2 << 20)
    dev.create(2 << 20)
    with pytest.raises(DeviceError):
        dev.create(2 << 20)
    assert dev.mem_info().free == 0
    dev.release(h)
    assert dev.mem_info().free == 2 << 20 and dev.peak == 4 << 20


def test_fit_recovers_a_known_step_time_model():
    truth = StepTimeModel.preset("llama-3.1-8b", "h200", flops_eff=0.45, bw_eff=0.7,
                                 step_overhead_s=4e-3, seq_overhead_s=3e-5)
    rows = []
    for n, new, ctx in ((1, 512, 0), (1, 2048, 0), (1, 4096, 0), (8, 8, 4096), (64, 64, 32768),
                        (128, 128, 76800), (32, 32, 65536)):
        pairs = new * (new + 1) / 2 if n == 1 else ctx + n
        rows.append([n, new, ctx, pairs, truth.step_time(n, new, ctx, pairs)])
    fit = fit_steptime(rows)
    assert fit["flops_eff"] == pytest.approx(0.45, abs=0.011)
    assert fit["bw_eff"] == pytest.approx(0.7, abs=0.011)
    assert fit["median_abs_rel_err"] < 0.02


def test_fit_separates_the_eager_prefill_steps_of_a_graphed_engine():
    """Decode-only steps replayed as graphs, steps with a prefill eager: the fit finds the
    prefill steps' extra host cost, and without the term it cannot fit both kinds."""
    truth = StepTimeModel.preset("llama-3.1-8b", "h200", flops_eff=0.6, bw_eff=0.5,
                                 step_overhead_s=1e-3, seq_overhead_s=2e-5,
                                 prefill_overhead_s=0.018)
    rows = []
    for n, new, ctx in ((1, 1, 300), (8, 8, 2400), (16, 16, 5000), (40, 40, 12000),
                        (9, 264, 2300), (17, 272, 4500), (2, 2048, 300), (1, 512, 0),
                        (20, 1044, 6000)):
        pairs = ctx + n if new == n else ctx + (new - n) * (new - n + 1) / 2
        rows.append([n, new, ctx, pairs, truth.step_time(n, new, ctx, pairs)])
    fit = fit_steptime(rows)
    assert fit["prefill_overhead_s"] == pytest.approx(0.018, rel=0.05)
    assert fit["flops_eff"] == pytest.approx(0.6, abs=0.011)
    assert fit["bw_eff"] == pytest.approx(0.5, abs=0.011)
    assert fit["median_abs_rel_err"] < 0.02
    one = fit_steptime(rows, prefill_term=False)
    assert one["prefill_overhead_s"] == 0.0
    assert one["p90_abs_rel_err"] > 5 * fit["p90_abs_rel_err"]
