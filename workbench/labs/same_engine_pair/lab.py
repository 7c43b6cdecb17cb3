"""The same-engine-pair lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.errors import ConfigError
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import (
    GIB,
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
from workbench.labs.same_engine_pair.sim import (
    sweep,
)
from workbench.ranges import Choice, Flag, Spec


@dataclass(slots=True)
class PairParams:
    quick: bool = False  # 2 repeats instead of 4
    seed: int = 0
    repeats: int | None = None
    kind: str = "vllm"  # "vllm" or "sglang": both instances
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    kv_budget_gib: float = 6.0  # what the two pools may map together
    phase_s: float = 15.0
    peak_rate: float = 3.0  # req/s while an instance peaks
    prompt_len: int = 1024
    output_len: int = 256
    ipc_demo: bool = True  # the same vs separate IPC names part (real /dev/shm segments)
    engine: str = "vllm"  # on sim the simulated engines of ``kind``; on host/gpu two real vLLMs
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "repeats": REPEATS, "kind": Choice(("vllm", "sglang")),
        "model": MODEL, "gpu": GPU, "kv_budget_gib": GIB, "phase_s": SECONDS,
        "peak_rate": RATE, "prompt_len": TOKENS, "output_len": TOKENS, "ipc_demo": Flag(),
        "engine": VLLM_SGLANG,
    }


class SameEnginePairLab(Lab):
    name = "same-engine-pair"
    description = ("two same-kind instances on one device, phases A-E: pages move between them; "
                   "same vs separate IPC names (seed 000 §7); on host/gpu two real elastic "
                   "vLLMs sharing one GPU budget")
    params_type = PairParams
    backends = ("sim", "host", "gpu")

    def check_backend(self, backend: str, params: Any = None) -> None:
        from workbench.labs.kit.vllm_rig import check_engine

        Lab.check_backend(self, backend, params)
        engine = getattr(params, "engine", "vllm")
        real = check_engine(self.name, backend, engine, "vllm", kinds=("vllm", "sglang"))
        if real and getattr(params, "kind", "vllm") not in ("vllm", engine):
            raise ConfigError(f"lab {self.name!r} parameter kind={params.kind!r} on backend "
                              f"{backend!r}", "the real pair is two vLLM processes",
                              "use kind=vllm, or backend sim for simulated SGLang-like ones")

    def run(self, params: PairParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        from workbench.labs.kit.vllm_rig import kind_kw, on_real

        if on_real(backend, params.engine):  # two real vLLMs / SGLangs: this lab's .vllm runner
            from workbench.labs.same_engine_pair.report import vllm_report
            from workbench.labs.same_engine_pair.vllm import run as run_vllm

            kw = kind_kw(params.engine)
            return real_result(vllm_report, lambda: run_vllm(backend, quick=params.quick, **kw))
        from workbench.labs.kit.ipc_names import ipc_names_demo, summary
        from workbench.labs.same_engine_pair.report import markdown, record

        self.check_backend(backend, params)
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
        return LabResult(record(params, data, rows, ipc, ipc_sum, backend),
                         markdown(params, data, rows, ipc_sum), tables=tables, figures=figs)
