"""The control-groups lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.control_groups.report import figures, markdown, record
from workbench.labs.control_groups.sim import (
    WORKLOADS,
    sweep,
)
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import QUICK, SEED, STEPTIME
from workbench.labs.kit.report import without_repeats
from workbench.ranges import Choices, Num, Opt, Spec


@dataclass(slots=True)
class ControlGroupsParams:
    peak: int = 16  # kvcached ramp PEAK (req/s per instance at its top)
    workloads: tuple[str, ...] = WORKLOADS
    cached_tokens: int = 16000  # group D's bound per instance (kvcached's bench value)
    steptime: str | None = "kvcached-fit"  # a calibration name or key=value overrides
    repeats: int = 1  # seeds seed, seed+1...; the ramp's arrival times are fixed, only tokens vary
    seed: int = 0
    quick: bool = False  # the readme and simultaneous workloads only
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "peak": Num(int, 1, 200, "req/s"), "workloads": Choices(WORKLOADS),
        "cached_tokens": Num(int, 1, 10_000_000, "tokens"), "steptime": Opt(STEPTIME),
        "repeats": Num(int, 1, 20), "seed": SEED, "quick": QUICK,
    }


class ControlGroupsLab(Lab):
    name = "control-groups"
    description = ("seed 000 §14.2's five control groups (static; KVCacheD without/with "
                   "prealloc; bounded/unlimited prefix cache) on the README's workload and two "
                   "others: TTFT/ITL percentiles, goodput")
    params_type = ControlGroupsParams
    backends = ("sim",)

    def run(self, params: ControlGroupsParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        rows = sweep(params, progress)
        table = without_repeats(rows)
        return LabResult(record(params, rows, backend), markdown(params, table),
                         tables={"cells": table}, figures=figures(table))
