"""Retrieve vs recompute: the break-even bandwidth decides long prompts; the chapter's figures
draw what the models compute."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.engines.sched.request import Request
from workbench.engines.sim.steptime import StepTimeModel
from workbench.engines.sim.workloads import _tokens
from workbench.pd.cluster import PDConfig, run_pd
from workbench.pd.crossover import Tier, break_even_Bps, crossover_rows, recompute_s, retrieve_s
from workbench.pd.link import LinkSpec

ST = StepTimeModel.preset("llama-3.1-8b", "a100")


def test_break_even_bandwidth_splits_tiers_on_long_prompts():
    be = break_even_Bps(ST)
    # 131072 KV bytes per token over 2 x 8.03e9 FLOPs at 60% of 312 TFLOP/s
    assert be == pytest.approx(131072 / (2 * 8.03e9 / (312e12 * 0.6)))
    fast, slow = Tier("fast", LinkSpec(2 * be, 0.0)), Tier("slow", LinkSpec(be / 2, 0.0))
    assert retrieve_s(ST, fast, 16384) < recompute_s(ST, 16384) < retrieve_s(ST, slow, 16384)


def test_lookup_and_latency_are_paid_once_per_retrieve():
    t = Tier("x", LinkSpec(10e9, 1e-3), lookup_s=2e-3)
    assert retrieve_s(ST, t, 1000) == pytest.approx(3e-3 + 1000 * 131072 / 10e9)
    rows = crossover_rows(ST, [t], [16, 4096])
    assert [r["tokens"] for r in rows] == [16, 4096] and set(rows[0]) == {"tokens", "recompute",
                                                                          "x"}
    assert rows[1]["recompute"] > rows[0]["recompute"]


def test_figures_draw_every_tier_and_every_phase():
    from workbench.viz.handover import crossover_figure, handover_figure

    fig = crossover_figure(crossover_rows(ST, [Tier("host", LinkSpec())], [16, 256]))
    assert [tr.name for tr in fig.data] == ["recompute", "host"]
    rng = np.random.default_rng(0)
    reqs = [Request(i, _tokens(rng, 512), 4, 0.1 * i, "x") for i in range(3)]
    res = run_pd(PDConfig(), reqs)
    fig = handover_figure(res)
    assert len(fig.data) == 3 * 7  # seven phases per request
    assert sum(tr.x[0] for tr in fig.data[:7]) == pytest.approx(reqs[0].finish - reqs[0].arrival)
