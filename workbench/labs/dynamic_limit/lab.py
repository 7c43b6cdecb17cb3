"""The dynamic-limit lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.labs.dynamic_limit.params import DynamicLimitParams
from workbench.labs.dynamic_limit.sim import (
    run_seed,
)
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import check_runner
from workbench.labs.kit.resolve import LabRun
from workbench.labs.kit.server_report import real_result


def run_sim(params: DynamicLimitParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    from workbench.labs.dynamic_limit.report import figures, markdown, record, tables

    seeds = [params.seed] if params.quick else [params.seed, params.seed + 1]
    runs = []
    for i, s in enumerate(seeds):
        runs.append(run_seed(params, s))
        if progress:
            progress(i + 1, len(seeds), f"seed {s}")
    tabs = tables(runs)
    return LabResult(record(runs, tabs, params, run.backend), markdown(runs, tabs, params),
                     tables=tabs, figures=figures(runs))


def run_server(params: DynamicLimitParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    """The server family: this lab's runner over real engine servers."""
    from workbench.labs.dynamic_limit.report import vllm_report
    from workbench.labs.dynamic_limit.server import run as run_vllm

    return real_result(vllm_report, lambda: run_vllm(run.backend, quick=params.quick,
                                                     kind=run.kind, runner=params.runner))


class DynamicLimitLab(Lab):
    name = "dynamic-limit"
    description = ("`workbench kvctl limit` from another process while traffic runs: revision, "
                   "shrink, convergence; misses and preemptions, no request killed (seed 000 §10); "
                   "on host/gpu while a real vLLM serves, on gpu a real SGLang (engine=sglang)")
    params_type = DynamicLimitParams
    runners = {"simulated": run_sim, "server": run_server}

    def check_run(self, params: DynamicLimitParams, run: LabRun) -> None:
        check_runner(self.name, params.runner, run)
