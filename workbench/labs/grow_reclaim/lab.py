"""The grow-reclaim lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.labs.grow_reclaim.report import checks, markdown, record
from workbench.labs.grow_reclaim.sim import VARIANTS, sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import (
    GPU,
    MODEL,
    QUICK,
    RATE,
    REPEATS,
    SECONDS,
    SEED,
    TOKENS,
    VLLM_SGLANG,
)
from workbench.labs.kit.phase_figs import phase_rows, timeline_figure
from workbench.labs.kit.vllm_report import real_result
from workbench.ranges import Num, Spec


@dataclass(slots=True)
class GrowReclaimParams:
    quick: bool = False  # 2 seeds instead of 4
    seed: int = 0  # the first seed; repeats use seed, seed+1, ...
    repeats: int | None = None  # None: 2 (quick) or 4
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    phase_s: float = 10.0  # each phase's length (simulated seconds)
    short_rate: float = 4.0  # req/s in the short phases
    short_len: int = 128  # prompt and output tokens of a short request
    long_rate: float = 2.0
    long_prompt: int = 4096
    long_output: int = 512
    min_reserved_pages: int = 5
    max_reserved_pages: int = 10
    # on sim the simulated vLLM-like engine (every field above); on host/gpu a real vLLM with
    # the tiny model, its own phases and a 1..2-page reserve (grow_reclaim.vllm)
    engine: str = "vllm"
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "repeats": REPEATS, "model": MODEL, "gpu": GPU,
        "phase_s": SECONDS, "short_rate": RATE, "short_len": TOKENS, "long_rate": RATE,
        "long_prompt": TOKENS, "long_output": TOKENS,
        "min_reserved_pages": Num(int, 0, 10000, "pages"),
        "max_reserved_pages": Num(int, 0, 10000, "pages"),
        "engine": VLLM_SGLANG,
    }


class GrowReclaimLab(Lab):
    name = "grow-reclaim"
    description = ("one instance, idle -> short -> long -> idle -> repeat: mapped pages follow "
                   "load, only empty pages go back, reserve and prealloc (seed 000 §6); on "
                   "host/gpu one real elastic vLLM")
    params_type = GrowReclaimParams
    backends = ("sim", "host", "gpu")

    def check_backend(self, backend: str, params: Any = None) -> None:
        from workbench.labs.kit.vllm_rig import check_engine

        Lab.check_backend(self, backend, params)
        check_engine(self.name, backend, getattr(params, "engine", "vllm"), "vllm",
                     kinds=("vllm", "sglang"))

    def run(self, params: GrowReclaimParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        from workbench.labs.kit.vllm_rig import kind_kw, on_real

        self.check_backend(backend, params)
        if on_real(backend, params.engine):  # a real vLLM / SGLang: this lab's .vllm runner
            from workbench.labs.grow_reclaim.report import vllm_report
            from workbench.labs.grow_reclaim.vllm import run as run_vllm

            kw = kind_kw(params.engine)
            return real_result(vllm_report, lambda: run_vllm(backend, quick=params.quick, **kw))
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
        return LabResult(record(params, data, rows, found, backend), md, tables=tables,
                         figures=figs)
