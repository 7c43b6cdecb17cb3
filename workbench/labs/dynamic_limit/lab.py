"""The dynamic-limit lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.labs.dynamic_limit.sim import (
    run_seed,
)
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import QUICK, RATE, SEED, TOKENS, VLLM_SGLANG
from workbench.labs.kit.vllm_report import real_result
from workbench.ranges import Num, Spec


@dataclass(slots=True)
class DynamicLimitParams:
    quick: bool = False  # 24 s of traffic and one seed instead of 48 s and two
    seed: int = 0
    rate: float = 8.0  # req/s
    prompt_len: int = 1024
    output_len: int = 256
    chunk_s: float = 0.5  # simulated seconds stepped between looks at the control plane
    engine: str = "vllm"  # sim: the simulated vLLM-like engine; host/gpu: a real vLLM; sglang: gpu
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "rate": RATE, "prompt_len": TOKENS, "output_len": TOKENS,
        "chunk_s": Num(float, 0.01, 60.0, "s"),
        "engine": VLLM_SGLANG,
    }


class DynamicLimitLab(Lab):
    name = "dynamic-limit"
    description = ("`workbench kvctl limit` from another process while traffic runs: revision, "
                   "shrink, convergence; misses and preemptions, no request killed (seed 000 §10); "
                   "on host/gpu while a real vLLM serves, on gpu a real SGLang (engine=sglang)")
    params_type = DynamicLimitParams
    backends = ("sim", "host", "gpu")

    def check_backend(self, backend: str, params: Any = None) -> None:
        from workbench.labs.kit.vllm_rig import check_engine

        Lab.check_backend(self, backend, params)
        check_engine(self.name, backend, getattr(params, "engine", "vllm"), "vllm",
                     kinds=("vllm", "sglang"))

    def run(self, params: DynamicLimitParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        from workbench.labs.kit.vllm_rig import kind_kw, on_real

        if on_real(backend, params.engine):  # a real vLLM / SGLang: this lab's .vllm runner
            from workbench.labs.dynamic_limit.report import vllm_report
            from workbench.labs.dynamic_limit.vllm import run as run_vllm

            kw = kind_kw(params.engine)
            return real_result(vllm_report, lambda: run_vllm(backend, quick=params.quick, **kw))
        from workbench.labs.dynamic_limit.report import figures, markdown, record, tables

        seeds = [params.seed] if params.quick else [params.seed, params.seed + 1]
        runs = []
        for i, s in enumerate(seeds):
            runs.append(run_seed(params, s))
            if progress:
                progress(i + 1, len(seeds), f"seed {s}")
        tabs = tables(runs)
        return LabResult(record(runs, tabs, params, backend), markdown(runs, tabs, params),
                         tables=tabs, figures=figures(runs))
