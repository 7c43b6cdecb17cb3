"""The H200 preset carries the step times fitted on the GPU; other GPUs say they have none."""

from __future__ import annotations

import pytest

from workbench.engines.sim.steptime import H200_MINI_FIT, StepTimeModel
from workbench.errors import ConfigError


def test_h200_preset_carries_the_fit():
    fit = StepTimeModel.preset("llama-3.1-8b", "h200", fitted=True)
    assert {k: getattr(fit, k) for k, _ in H200_MINI_FIT} == dict(H200_MINI_FIT)
    roof = StepTimeModel.preset("llama-3.1-8b", "h200")
    assert roof.step_overhead_s != fit.step_overhead_s  # the roofline guess stays the default
    assert StepTimeModel.preset("llama-3.1-8b", "h200", fitted=True, bw_eff=0.7).bw_eff == 0.7
    # a decode-only step is the weights' read; a step with a prefill chunk adds the eager
    # forward's measured host cost on top
    weights = fit.model.weight_bytes / (fit.gpu.peak_bw * fit.bw_eff)
    assert fit.step_time(1, 1, 256, 257) == pytest.approx(
        weights + fit.step_overhead_s + fit.seq_overhead_s, rel=0.01)
    assert fit.cost(2, 257, 256, 256 * 257 / 2 + 257).cpu_s == pytest.approx(
        fit.step_overhead_s + 2 * fit.seq_overhead_s + 0.0177)


def test_unmeasured_gpu_has_no_fit():
    with pytest.raises(ConfigError, match="not been measured"):
        StepTimeModel.preset("llama-3.1-8b", "a100", fitted=True)
