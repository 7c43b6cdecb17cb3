"""Retrieve or recompute (pure): the time to bring a prompt's KV from a tier against the time to
compute it again (seed 003 E5's question, in its simplest form).

* recompute: one step that prefills the prompt alone on the step-time model (the same roofline
  the simulated engines run; a real engine would chunk it and batch it with others);
* retrieve: the tier's lookup (metadata) time plus the link's latency and the KV bytes over its
  bandwidth.

Per token, retrieving pays ``kv_bytes_per_token / bandwidth`` and recomputing about
``2 * active_params / (flops * efficiency)``; their ratio is the break-even bandwidth
(:func:`break_even_Bps`): a tier slower than that loses to recompute on long prompts.
"""

from __future__ import annotations

from typing import NamedTuple

from workbench.engines.sched.scheduler import attn_pairs
from workbench.engines.sim.steptime import StepTimeModel
from workbench.pd.link import LinkSpec, kv_bytes


class Tier(NamedTuple):
    name: str
    link: LinkSpec
    lookup_s: float = 0.0  # metadata: asking whether (and where) the object is


def recompute_s(st: StepTimeModel, tokens: int) -> float:
    return st.step_time(1, tokens, 0, attn_pairs(tokens, 0))


def retrieve_s(st: StepTimeModel, tier: Tier, tokens: int) -> float:
    return tier.lookup_s + tier.link.transfer_s(kv_bytes(st.model, tokens))


def break_even_Bps(st: StepTimeModel) -> float:
    """The bandwidth at which retrieving a token costs what computing it costs (compute-bound
    prefill, attention ignored: long prompts make it a little higher)."""
    per_token = 2.0 * st.model.active_params / (st.gpu.peak_flops * st.flops_eff)
    return st.model.kv_bytes_per_token / per_token


def crossover_rows(st: StepTimeModel, tiers: list[Tier],
                   lengths: list[int]) -> list[dict[str, float]]:
    """One row per prompt length: recompute seconds and each tier's retrieve seconds."""
    return [{"tokens": n, "recompute": recompute_s(st, n),
             **{t.name: retrieve_s(st, t, n) for t in tiers}} for n in lengths]
