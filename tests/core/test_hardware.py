"""One GPU-preset registry: the simulator and the step-time model read the same records, and
every latency not measured on a GPU is marked, and a copied one equals its source."""

from __future__ import annotations

import pytest

from workbench.engines.sim.steptime import GPUS, H200_MINI_FIT, StepTimeModel
from workbench.errors import ConfigError
from workbench.hardware import GPU_PRESETS, VMM_CALLS, gpu_preset
from workbench.sim.device import PRESETS, SimDevice


@pytest.mark.parametrize("key", list(GPU_PRESETS))
def test_sim_and_steptime_describe_the_same_gpu(key):
    g = GPU_PRESETS[key]
    sim, spec = PRESETS[key], GPUS[key]
    assert (sim.capacity, sim.granularity, sim.latency) == (g.memory_bytes, g.granularity, g.vmm)
    assert (spec.name, spec.memory_bytes, spec.peak_flops, spec.peak_bw, spec.fitted) == (
        g.model, g.memory_bytes, g.peak_flops, g.peak_bw, g.step_fit)
    assert SimDevice(key).preset.provenance is g.provenance


@pytest.mark.parametrize("key", list(GPU_PRESETS))
def test_a_copied_latency_is_marked_and_is_the_source_gpus(key):
    p = GPU_PRESETS[key].provenance
    assert set(p.vmm_measured) <= set(VMM_CALLS)
    if p.vmm_copied_from is None:  # unmeasured calls are estimates the text owns up to
        assert all(call in p.vmm for call in p.vmm_unmeasured) and "estimate" in p.vmm
        return
    source = GPU_PRESETS[p.vmm_copied_from]
    assert p.vmm_unmeasured
    for call in p.vmm_unmeasured:
        assert getattr(GPU_PRESETS[key].vmm, call) == getattr(source.vmm, call)


def test_h100_vmm_latencies_say_they_are_the_h200s():
    p = GPU_PRESETS["h100"].provenance
    assert p.vmm_measured == () and p.vmm_unmeasured == VMM_CALLS and p.vmm_copied_from == "h200"
    assert "not measured" in p.vmm
    assert GPU_PRESETS["h100"].vmm == GPU_PRESETS["h200"].vmm


def test_fits_and_unknown_gpus():
    assert GPUS["h200"].fitted == H200_MINI_FIT
    assert StepTimeModel.preset("llama-3.1-8b", "h200", fitted=True).flops_eff == dict(
        H200_MINI_FIT)["flops_eff"] == 0.68
    with pytest.raises(ConfigError, match="has no preset"):
        gpu_preset("b200")
