"""How much KV kvcached's A100-80G colocation run left beside three Llama-3.1-8B weight sets, and
the same arithmetic on another card (docs/sources.md#upstream-kvcached-setting).

kvcached's harness runs vLLM 0.9.2 with no ``--gpu-memory-utilization`` for its elastic engines and
keeps ``--gpu-memory-utilization 0.31`` (commented out) for the static baseline; kvcached itself
maps pages while the device's free memory stays above ``(1 - 0.95)`` of its total. Two ways to
the same total, so both are computed:

* **static** (what the sweep uses): vLLM sizes each engine's KV as ``total * 0.31`` minus what its
  profile charges (weights, the torch peak of the profile run, the non-torch growth); three such
  shares are the total, and the static split is one share each.
* **kvcached's cap**: the free memory three engines leave (each also holds its CUDA context and
  CUDA graphs, outside the profile) less kvcached's 5 % headroom.

The profile's parts are vLLM's own log lines for this model on an 80 GB card; kvcached published
none of its run's, so the activation, non-torch, context and graph figures are estimates (the
docstring of :data:`LLAMA_8B_A100` says which) and the total is good to about +-1.5 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import ConfigError
from workbench.units import GiB, MiB

STATIC_UTILIZATION = 0.31  # kvcached's bench-config.yaml, the static baseline's share
KVCACHED_UTILIZATION = 0.95  # kvcached_gpu_utilization in the same file (its default too)
A100_80G_TOTAL = round(79.15 * GiB)  # total_gpu_memory as vLLM logs it on an A100-SXM4-80GB
GRANULE = 2 * MiB  # the elastic pools' unit: budgets are whole granules


@dataclass(frozen=True, slots=True)
class Footprint:
    """What one vLLM engine holds besides its KV, in bytes."""

    weights: int  # vLLM's "model weights take ..."
    activation_peak: int  # the profile run's torch peak increase
    non_torch: int  # the profile's non-torch increase (cuBLAS workspace and the like)
    context: int  # the CUDA context, made before the profile's first snapshot
    cuda_graphs: int  # captured after the KV is sized, outside the profile

    @property
    def profiled(self) -> int:
        """What vLLM's profile subtracts from ``total * utilization``."""
        return self.weights + self.activation_peak + self.non_torch

    @property
    def resident(self) -> int:
        """All an engine holds on the device besides its KV."""
        return self.profiled + self.context + self.cuda_graphs


# Llama-3.1-8B in bf16 at max_num_batched_tokens 2048 (vLLM's serving default on an A100): weights
# 14.99 GiB and the activation peak 1.20 GiB as vLLM's profile logs them on 80 GB cards; the
# non-torch growth 0.11 GiB, the CUDA context 0.5 GiB and the graphs 0.5 GiB are estimates.
LLAMA_8B_A100 = Footprint(weights=round(14.99 * GiB), activation_peak=round(1.20 * GiB),
                          non_torch=round(0.11 * GiB), context=GiB // 2, cuda_graphs=GiB // 2)


@dataclass(frozen=True, slots=True)
class SettingBudget:
    """The KV of kvcached's setting on one card: the total all engines share, each static
    engine's share of it, and what kvcached's own headroom rule would leave there."""

    total_bytes: int  # instances * static share, in whole granules: every mode's budget
    static_bytes: int  # one static engine's KV: total / instances
    kvcached_cap_bytes: int  # free after the engines, less kvcached's headroom

    def gib(self) -> dict[str, float]:
        return {k: round(getattr(self, k) / GiB, 2) for k in
                ("total_bytes", "static_bytes", "kvcached_cap_bytes")}


def static_share(total: int, fp: Footprint, utilization: float = STATIC_UTILIZATION) -> int:
    """One engine's KV under vLLM's profile: ``total * utilization`` less what it profiles."""
    return int(total * utilization) - fp.profiled


def kvcached_cap(total: int, fp: Footprint, instances: int = 3,
                 utilization: float = KVCACHED_UTILIZATION) -> int:
    """The bytes kvcached lets ``instances`` engines map together: the device's free memory once
    they are up, less ``(1 - utilization) * total`` (its per-map headroom check)."""
    return total - instances * fp.resident - int(total * (1 - utilization))


def setting_budget(total: int = A100_80G_TOTAL, fp: Footprint = LLAMA_8B_A100,
                   instances: int = 3) -> SettingBudget:
    """kvcached's setting on a card of ``total`` bytes (default: its A100-80G): the static
    arithmetic gives the total (a whole number of granules, split evenly), kvcached's headroom
    rule the cap beside it."""
    share = static_share(total, fp)
    if instances < 1 or share <= 0:
        raise ConfigError(f"{instances} engines on {total / GiB:.1f} GiB",
                          "leave no KV beside their weights at a 0.31 share each",
                          "use a larger card or fewer engines")
    whole = share * instances // GRANULE * GRANULE
    return SettingBudget(whole, whole // instances, kvcached_cap(total, fp, instances))
