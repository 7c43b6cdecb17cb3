"""The no-fake-enable lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import QUICK, RATE, SEED, TOKENS, VLLM_ONLY
from workbench.labs.kit.vllm_report import real_result
from workbench.labs.no_fake_enable.sim import (
    run_all,
)
from workbench.ranges import Spec


@dataclass(slots=True)
class NoFakeEnableParams:
    quick: bool = False  # one seed and 24 requests per arm instead of three seeds and 64
    seed: int = 0
    rate: float = 8.0  # burst arrival rate, req/s
    prompt_len: int = 2048
    output_len: int = 128
    engine: str = "vllm"  # on sim the simulated vLLM-like engine; on host/gpu a real vLLM
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "rate": RATE, "prompt_len": TOKENS, "output_len": TOKENS,
        "engine": VLLM_ONLY,
    }


class NoFakeEnableLab(Lab):
    name = "no-fake-enable"
    description = ("is elastic KV really on? autopatch switch, elastic pool, mapped bytes "
                   "following load, the control segment; each check failing when it is off "
                   "(seed 000 §5); on host/gpu three real vLLM starts (elastic, .pth not run, "
                   "stock) judged by the real patch log, doctor and kvctl list")
    params_type = NoFakeEnableParams
    backends = ("sim", "host", "gpu")

    def check_backend(self, backend: str, params: Any = None) -> None:
        from workbench.labs.kit.vllm_rig import check_engine

        Lab.check_backend(self, backend, params)
        check_engine(self.name, backend, getattr(params, "engine", "vllm"), "vllm")

    def run(self, params: NoFakeEnableParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        from workbench.labs.kit.vllm_rig import on_real

        if on_real(backend, params.engine):  # three real vLLM starts: this lab's .vllm runner
            from workbench.labs.no_fake_enable.report import vllm_report
            from workbench.labs.no_fake_enable.vllm import run as run_vllm

            return real_result(vllm_report, lambda: run_vllm(backend, quick=params.quick))
        from workbench.labs.no_fake_enable.report import figures, markdown, record, tables

        out = run_all(params, progress)
        tabs = tables(out)
        return LabResult(record(out, tabs, params, backend), markdown(out, tabs, params),
                         tables=tabs, figures=figures(out))
