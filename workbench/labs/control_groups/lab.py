"""The control-groups lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.labs.control_groups.params import ControlGroupsParams
from workbench.labs.control_groups.report import figures, markdown, record
from workbench.labs.control_groups.sim import (
    sweep,
)
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.report import without_repeats
from workbench.labs.kit.resolve import LabRun


def run_sim(params: ControlGroupsParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    rows = sweep(params, progress)
    table = without_repeats(rows)
    return LabResult(record(params, rows, run.backend), markdown(params, table),
                     tables={"cells": table}, figures=figures(table))


class ControlGroupsLab(Lab):
    name = "control-groups"
    description = ("seed 000 §14.2's five control groups (static; KVCacheD without/with "
                   "prealloc; bounded/unlimited prefix cache) on the README's workload and two "
                   "others: TTFT/ITL percentiles, goodput")
    params_type = ControlGroupsParams
    runners = {"simulated": run_sim}
