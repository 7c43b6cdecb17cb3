"""The same-engine-pair lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.errors import ConfigError
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.phase_figs import phase_rows, timeline_figure
from workbench.labs.kit.resolve import LabRun
from workbench.labs.kit.server_report import real_result
from workbench.labs.same_engine_pair.params import DEFAULT_KIND, PairParams
from workbench.labs.same_engine_pair.sim import (
    sweep,
)


def run_sim(params: PairParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    from workbench.labs.kit.ipc_names import ipc_names_demo, summary
    from workbench.labs.same_engine_pair.report import markdown, record

    data = sweep(params, progress)
    ipc = ipc_names_demo(params.model) if params.ipc_demo else None
    ipc_sum = summary(ipc) if ipc else None
    run0 = data["runs"][0]["run"]
    rows = phase_rows(run0, f"seed {data['runs'][0]['seed']}")
    figs = {"stacked": timeline_figure(run0, "mapped KV of both instances (stacked) against "
                                       "the budget", stacked=True),
            "timeline": timeline_figure(run0, "each instance: mapped, in use, reserve")}
    figs = {k: v for k, v in figs.items() if v is not None}
    checks = [dict(r["checks"], seed=r["seed"]) for r in data["runs"]]
    tables = {"phases": rows, "checks": checks, "ipc_steps": ipc["steps"] if ipc else []}
    return LabResult(record(params, data, rows, ipc, ipc_sum, run.backend),
                     markdown(params, data, rows, ipc_sum), tables=tables, figures=figs)


def run_server(params: PairParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    """The server family: this lab's runner over real engine servers."""
    from workbench.labs.same_engine_pair.report import vllm_report
    from workbench.labs.same_engine_pair.server import run as run_vllm

    return real_result(vllm_report, lambda: run_vllm(run.backend, quick=params.quick,
                                                     kind=run.kind))


class SameEnginePairLab(Lab):
    name = "same-engine-pair"
    description = ("two same-kind instances on one device, phases A-E: pages move between them; "
                   "same vs separate IPC names (seed 000 §7); on host/gpu two real elastic "
                   "vLLMs sharing one GPU budget")
    params_type = PairParams
    runners = {"simulated": run_sim, "server": run_server}

    def check_run(self, params: PairParams, run: LabRun) -> None:
        """On servers the pair is two engines of the run's kind: ``kind`` (the simulated
        pair's scheduler) left at its default or naming that kind's scheduler."""
        if run.engine is not None and run.family == "server" and \
                params.kind not in (DEFAULT_KIND, run.engine.scheduler):
            raise ConfigError(f"lab {self.name!r} parameter kind={params.kind!r} on backend "
                              f"{run.backend!r}", f"the real pair is two {run.engine.title} "
                              "processes", f"use kind={run.engine.scheduler}, or backend sim "
                              "for simulated SGLang-like ones")
