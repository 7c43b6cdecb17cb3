"""The baseline lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import replace

from workbench.labs.baseline.params import BaselineParams
from workbench.labs.baseline.report import figures, markdown, record
from workbench.labs.baseline.sim import knee, sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.report import without_repeats
from workbench.labs.kit.resolve import LabRun


def run_sim(params: BaselineParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    params = replace(params, engine=run.engine.scheduler)  # the simulator names schedulers
    rows = sweep(params, progress)
    k = knee(rows)
    table = without_repeats(rows)
    return LabResult(record(params, rows, k, run.backend), markdown(params, table, k),
                     tables={"rates": table}, figures=figures(table, k))


class BaselineLab(Lab):
    name = "baseline"
    description = ("latency-throughput curve of one instance as the Poisson request rate "
                   "rises (TTFT/TPOT/ITL/E2E p50/p95/p99); the knee and saturation by rule")
    params_type = BaselineParams
    runners = {"simulated": run_sim}
