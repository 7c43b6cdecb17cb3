"""The no-fake-enable lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.resolve import LabRun
from workbench.labs.kit.server_report import real_result
from workbench.labs.no_fake_enable.params import NoFakeEnableParams
from workbench.labs.no_fake_enable.sim import (
    run_all,
)


def run_sim(params: NoFakeEnableParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    from workbench.labs.no_fake_enable.report import figures, markdown, record, tables

    out = run_all(params, progress)
    tabs = tables(out)
    return LabResult(record(out, tabs, params, run.backend), markdown(out, tabs, params),
                     tables=tabs, figures=figures(out))


def run_server(params: NoFakeEnableParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    """The server family: this lab's runner over real engine servers."""
    from workbench.labs.no_fake_enable.report import vllm_report
    from workbench.labs.no_fake_enable.server import run as run_vllm

    return real_result(vllm_report, lambda: run_vllm(run.backend, quick=params.quick))


class NoFakeEnableLab(Lab):
    name = "no-fake-enable"
    description = ("is elastic KV really on? autopatch switch, elastic pool, mapped bytes "
                   "following load, the control segment; each check failing when it is off "
                   "(seed 000 §5); on host/gpu three real vLLM starts (elastic, .pth not run, "
                   "stock) judged by the real patch log, doctor and kvctl list")
    params_type = NoFakeEnableParams
    runners = {"simulated": run_sim, "server": run_server}
