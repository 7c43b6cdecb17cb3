"""The store-routes lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.resolve import LabRun
from workbench.labs.store_routes.params import StoreRoutesParams
from workbench.labs.store_routes.sim import (
    sweep,
)


def run_sim(params: StoreRoutesParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    from workbench.labs.store_routes.report import build
    return build(params, sweep(params, progress), run.backend)


class StoreRoutesLab(Lab):
    name = "store-routes"
    description = ("Mooncake-style store (modelled) reached directly or through an LMCache-style "
                   "cache layer: metadata requests, payload bytes, effective bandwidth, "
                   "cross-instance reads, eviction under pressure (seed 003 E6)")
    params_type = StoreRoutesParams
    runners = {"simulated": run_sim}
