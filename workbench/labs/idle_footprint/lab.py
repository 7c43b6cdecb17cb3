"""The idle-footprint lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.labs.idle_footprint.params import IdleFootprintParams
from workbench.labs.idle_footprint.report import markdown, record
from workbench.labs.idle_footprint.sim import sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.resolve import LabRun
from workbench.labs.kit.server_report import real_result


def run_sim(params: IdleFootprintParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    rows = sweep(params.quick, params.seed, progress)
    return LabResult(record(rows, params.seed, run.backend), markdown(rows), tables={"rows": rows})


def run_server(params: IdleFootprintParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    """The server family: this lab's runner over real engine servers."""
    from workbench.labs.idle_footprint.report import vllm_report
    from workbench.labs.idle_footprint.server import run as run_vllm

    return real_result(vllm_report, lambda: run_vllm(run.backend, quick=params.quick,
                                                     seed=params.seed))


class IdleFootprintLab(Lab):
    name = "idle-footprint"
    description = ("idle footprint after prefix-heavy traffic vs the packed floor (page-aware vs "
                   "LRU eviction; vLLM-like and SGLang-like); on host/gpu what a real vLLM's "
                   "prefix cache pins")
    params_type = IdleFootprintParams
    runners = {"simulated": run_sim, "server": run_server}
