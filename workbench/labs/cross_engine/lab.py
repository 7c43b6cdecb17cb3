"""The cross-engine lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`; ``engine=real`` on ``gpu``: one real
vLLM and one real SGLang, :mod:`.real` and :mod:`.real_report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.errors import ConfigError
from workbench.labs.cross_engine.sim import sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import GIB, GPU, MODEL, QUICK, RATE, REPEATS, SECONDS, SEED, TOKENS
from workbench.ranges import Choice, Num, Spec


@dataclass(slots=True)
class CrossEngineParams:
    quick: bool = False  # 2 seeds instead of 3
    seed: int = 0
    repeats: int | None = None
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    kv_budget_gib: float = 6.0
    phase_s: float = 15.0
    peak_rate: float = 3.0
    warm_rate: float = 1.0  # stage 6 warm-up: fills the caches without contention
    prompt_len: int = 1024
    output_len: int = 256
    big_bound: int = 32768  # stage 6: cached-token bounds, the big one and the small one
    small_bound: int = 2048
    engine: str = "sim"  # sim: the simulated pair; real (gpu): a real vLLM and a real SGLang
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "repeats": REPEATS, "model": MODEL, "gpu": GPU,
        "kv_budget_gib": GIB, "phase_s": SECONDS, "peak_rate": RATE, "warm_rate": RATE,
        "prompt_len": TOKENS, "output_len": TOKENS,
        "big_bound": Num(int, 1, 10_000_000, "tokens"),
        "small_bound": Num(int, 1, 10_000_000, "tokens"),
        "engine": Choice(("sim", "real")),
    }


class CrossEngineLab(Lab):
    name = "cross-engine"
    description = ("a vLLM-like and an SGLang-like instance on one device, six stages: physical "
                   "reuse without shared metadata, and no fairness (seed 000 §8); engine=real "
                   "on gpu: a real vLLM and a real SGLang under one budget")
    params_type = CrossEngineParams
    backends = ("sim", "gpu")

    def check_backend(self, backend: str, params: Any = None) -> None:
        """``sim`` runs the simulated pair, ``gpu`` the real one (engine=real: both engines'
        interpreters must be there); any other pairing is refused in one line, never swapped."""
        from workbench.backends import kind

        engine = getattr(params, "engine", "sim")
        want = "real" if kind(backend) == "gpu" else "sim"
        if engine != want:
            raise ConfigError(f"lab {self.name!r} parameter engine={engine!r} on backend "
                              f"{backend!r}", "sim runs the simulated pair, gpu a real vLLM "
                              "and a real SGLang", f"use engine={want} on {kind(backend)}, or "
                              f"--backend {'gpu' if engine == 'real' else 'sim'}")
        Lab.check_backend(self, backend, params)
        if engine == "real":
            from workbench.labs.kit.vllm_rig import python_for

            python_for(self.name, "vllm")
            python_for(self.name, "sglang")

    def run(self, params: CrossEngineParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        from workbench.labs.cross_engine.report import build

        self.check_backend(backend, params)
        if params.engine == "real":
            from workbench.labs.cross_engine.real import run as run_real
            from workbench.labs.cross_engine.real_report import report
            from workbench.labs.kit.vllm_report import real_result

            return real_result(report, lambda: run_real(backend, params.quick))
        return build(params, sweep(params, progress), backend)
