"""The non-prefix-reuse lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`, :mod:`.mini`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.resolve import LabRun
from workbench.labs.non_prefix_reuse.params import NonPrefixReuseParams
from workbench.labs.non_prefix_reuse.sim import (
    CASES,
    sweep,
)


def run_sim(params: NonPrefixReuseParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    from workbench.labs.non_prefix_reuse.report import build

    return build(params, sweep(params, progress), run.backend)


def run_mini(params: NonPrefixReuseParams, run: LabRun,
             progress: Progress | None = None) -> LabResult:
    """The simulated costs, and the quality proxy on the mini model (real tokens, CPU)."""
    from workbench.labs.non_prefix_reuse.mini import quality
    from workbench.labs.non_prefix_reuse.report import build

    data = sweep(params, progress)
    data["quality"] = quality(CASES[:4], data["seeds"])
    return build(params, data, run.backend)


class NonPrefixReuseLab(Lab):
    name = "non-prefix-reuse"
    description = ("full prefill vs exact prefix cache vs CacheBlend-style blended reuse "
                   "(modelled): TTFT, recomputed tokens, retrieved bytes; on host a quality "
                   "proxy on the mini model (seed 003 E9)")
    params_type = NonPrefixReuseParams
    runners = {"simulated": run_sim, "mini": run_mini}
    needs = {"mini": {"cuda": False}}  # the quality proxy runs on the CPU (host)
