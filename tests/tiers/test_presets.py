"""Tier cost presets: the assumed default, the H200-measured set with its provenance, and the sim
lab using the measured one only when asked."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.errors import ConfigError
from workbench.labs.tiered_retrieval.lab import TieredRetrievalParams
from workbench.labs.tiered_retrieval.sim import costs
from workbench.tiers.presets import PRESETS, TierCosts, tier_costs


def test_measured_preset_changes_only_what_was_measured():
    measured, prov = PRESETS["h200-measured"]
    assert PRESETS["assumed"] == (TierCosts(), None)
    assert set(prov.measured) | set(prov.assumed) | {"chunk_tokens", "hbm_bytes"} == {
        f.name for f in dataclasses.fields(TierCosts)}
    for name in prov.assumed:
        assert getattr(measured, name) == getattr(TierCosts(), name)
    assert prov.command.startswith("workbench bench crossover") and prov.device and prov.date
    assert prov.recompute_s_per_token > 0


def test_the_sim_lab_uses_the_measured_preset_only_when_asked():
    p = TieredRetrievalParams(pcie_gbps=7.0)
    assert costs(p).pcie_bw == 7e9
    m = costs(dataclasses.replace(p, costs="h200-measured"))
    ref = tier_costs("h200-measured")
    assert (m.pcie_bw, m.pcie_op_s, m.dram_lookup_s) == (ref.pcie_bw, ref.pcie_op_s,
                                                         ref.dram_lookup_s)
    with pytest.raises(ConfigError, match="is not defined"):
        tier_costs("guess")
