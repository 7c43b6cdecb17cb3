"""The idle-footprint lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.labs.idle_footprint.report import markdown, record
from workbench.labs.idle_footprint.sim import sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import QUICK, SEED, VLLM_ONLY
from workbench.labs.kit.vllm_report import real_result
from workbench.ranges import Spec


@dataclass(slots=True)
class IdleFootprintParams:
    quick: bool = False  # 500 requests instead of 2,500
    seed: int = 0
    # on sim the simulated vLLM-like and SGLang-like engines; on host/gpu two real elastic
    # vLLMs (cache unbounded, and under the adapter's LRU bound; idle_footprint.vllm)
    engine: str = "vllm"
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED,
        "engine": VLLM_ONLY,
    }


class IdleFootprintLab(Lab):
    name = "idle-footprint"
    description = ("idle footprint after prefix-heavy traffic vs the packed floor (page-aware vs "
                   "LRU eviction; vLLM-like and SGLang-like); on host/gpu what a real vLLM's "
                   "prefix cache pins")
    params_type = IdleFootprintParams
    backends = ("sim", "host", "gpu")

    def check_backend(self, backend: str, params: Any = None) -> None:
        from workbench.labs.kit.vllm_rig import check_engine

        Lab.check_backend(self, backend, params)
        check_engine(self.name, backend, getattr(params, "engine", "vllm"), "vllm")

    def run(self, params: IdleFootprintParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        from workbench.labs.kit.vllm_rig import on_real

        if on_real(backend, params.engine):  # a real vLLM: this lab's .vllm runner
            from workbench.labs.idle_footprint.report import vllm_report
            from workbench.labs.idle_footprint.vllm import run as run_vllm

            return real_result(vllm_report, lambda: run_vllm(backend, quick=params.quick,
                                                             seed=params.seed))
        rows = sweep(params.quick, params.seed, progress)
        return LabResult(record(rows, params.seed, backend), markdown(rows), tables={"rows": rows})
