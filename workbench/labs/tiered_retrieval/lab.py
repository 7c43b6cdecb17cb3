"""The tiered-retrieval lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`, :mod:`.mini`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.resolve import LabRun
from workbench.labs.tiered_retrieval.params import TieredRetrievalParams
from workbench.labs.tiered_retrieval.sim import (
    sweep,
)
from workbench.tiers.presets import tier_costs


def run_sim(params: TieredRetrievalParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    from workbench.labs.tiered_retrieval.report import build

    tier_costs(params.costs)  # a bad preset name is refused on every backend
    return build(params, sweep(params, progress), run.backend)


def run_mini(params: TieredRetrievalParams, run: LabRun,
             progress: Progress | None = None) -> LabResult:
    """The mini engine's host tier (no L2) on real memory."""
    from workbench.labs.tiered_retrieval.mini import run_mini as run_tiers
    from workbench.labs.tiered_retrieval.mini_report import build_mini

    tier_costs(params.costs)
    return build_mini(params, run_tiers(params, run.backend, progress), run.backend)


class TieredRetrievalLab(Lab):
    name = "tiered-retrieval"
    description = ("LMCache-style tiers (modelled): baseline / HBM / CPU / L2 / all-miss with "
                   "TTFT split into lookup, retrieve, H2D, wait, prefill; retrieve-vs-recompute "
                   "crossover (seed 003 E5)")
    params_type = TieredRetrievalParams
    runners = {"simulated": run_sim, "mini": run_mini}
