"""The grow-reclaim lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.labs.grow_reclaim.params import GrowReclaimParams
from workbench.labs.grow_reclaim.report import checks, markdown, record
from workbench.labs.grow_reclaim.sim import VARIANTS, sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import check_runner
from workbench.labs.kit.phase_figs import phase_rows, timeline_figure
from workbench.labs.kit.resolve import LabRun
from workbench.labs.kit.server_report import real_result


def run_sim(params: GrowReclaimParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    data = sweep(params, progress)
    first = data["seeds"][0]
    rows = [r for v in VARIANTS for r in phase_rows(data["runs"][v][first], v)]
    found = {v: [checks(data["runs"][v][s], v, params) for s in data["seeds"]]
             for v in VARIANTS}
    figs = {f"timeline_{v}": timeline_figure(
        data["runs"][v][first], f"{v}: memory of one instance (seed {first})")
        for v in VARIANTS}
    figs = {k: f for k, f in figs.items() if f is not None}
    md = markdown(params, data, rows, found)
    tables = {"phases": rows, "checks": [dict(c, variant=v, seed=s) for v in VARIANTS
                                         for s, c in zip(data["seeds"], found[v],
                                                         strict=True)]}
    return LabResult(record(params, data, rows, found, run.backend), md, tables=tables,
                     figures=figs)


def run_server(params: GrowReclaimParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    """The server family: this lab's runner over real engine servers."""
    from workbench.labs.grow_reclaim.report import vllm_report
    from workbench.labs.grow_reclaim.server import run as run_vllm

    return real_result(vllm_report, lambda: run_vllm(run.backend, quick=params.quick,
                                                     kind=run.kind, runner=params.runner))


class GrowReclaimLab(Lab):
    name = "grow-reclaim"
    description = ("one instance, idle -> short -> long -> idle -> repeat: mapped pages follow "
                   "load, only empty pages go back, reserve and prealloc (seed 000 §6); on "
                   "host/gpu one real elastic vLLM")
    params_type = GrowReclaimParams
    runners = {"simulated": run_sim, "server": run_server}

    def check_run(self, params: GrowReclaimParams, run: LabRun) -> None:
        check_runner(self.name, params.runner, run)
