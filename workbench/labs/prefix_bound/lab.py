"""The prefix-bound lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import replace

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.resolve import LabRun
from workbench.labs.prefix_bound.params import PrefixBoundParams
from workbench.labs.prefix_bound.sim import (
    sweep,
)


def run_sim(params: PrefixBoundParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    from workbench.labs.prefix_bound.report import build

    params = replace(params, engine=run.engine.scheduler)  # the simulator names schedulers
    return build(params, sweep(params, progress), run.backend)


class PrefixBoundLab(Lab):
    name = "prefix-bound"
    description = ("prefix cache bound -1 / 0 / N: three request classes and prefix groups A-D; "
                   "hits, computed tokens, TTFT, mapped pages, evictions (seed 000 §9, 003 E4)")
    params_type = PrefixBoundParams
    runners = {"simulated": run_sim}
