"""The cross-engine lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`; ``engine=real`` on ``gpu``: one real
vLLM and one real SGLang, :mod:`.real` and :mod:`.real_report`)."""

from __future__ import annotations

from workbench.labs.cross_engine.params import CrossEngineParams
from workbench.labs.cross_engine.sim import sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.resolve import LabRun


def run_sim(params: CrossEngineParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    from workbench.labs.cross_engine.report import build

    return build(params, sweep(params, progress), run.backend)


def run_server(params: CrossEngineParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    """A real vLLM and a real SGLang under one budget (the pair's interpreters checked)."""
    from workbench.labs.cross_engine.real import run as run_real
    from workbench.labs.cross_engine.real_report import report
    from workbench.labs.kit.server_report import real_result

    return real_result(report, lambda: run_real(run.backend, params.quick))


class CrossEngineLab(Lab):
    name = "cross-engine"
    description = ("a vLLM-like and an SGLang-like instance on one device, six stages: physical "
                   "reuse without shared metadata, and no fairness (seed 000 §8); engine=real "
                   "on gpu: a real vLLM and a real SGLang under one budget")
    params_type = CrossEngineParams
    runners = {"simulated": run_sim, "server": run_server}
