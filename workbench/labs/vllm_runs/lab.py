"""The real-vLLM runs as :class:`~workbench.labs.base.Lab` objects, so ``run_lab``, the CLI and
the chapters drive them like any lab: ``workbench labs run output-equality --backend gpu
--param engine=vllm`` routes here (:func:`for_engine`)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import QUICK, SEED
from workbench.ranges import Choice, Spec

MODULES = {"output-equality": "output_equality", "dynamic-limit": "dynamic_limit",
           "kv-capacity": "kv_capacity"}


@dataclass(slots=True)
class RealParams:
    engine: str = "vllm"  # the real vLLM process (engine=mini: the mini engine, the lab's own)
    quick: bool = False
    seed: int = 0  # accepted for the CLI's shared options; the runs fix their own seeds
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "engine": Choice(("vllm", "mini")), "quick": QUICK, "seed": SEED,
    }


class RealVllmLab(Lab):
    params_type = RealParams
    backends = ("host", "gpu")

    def __init__(self, name: str):
        self.name = name
        self.description = f"{name} on a real vLLM (its OpenAI server, elastic vs stock)"

    def check_backend(self, backend: str, params: Any = None) -> None:
        from workbench.engines.real.vllm import require_vllm

        Lab.check_backend(self, backend, params)
        require_vllm(f"lab {self.name!r} with engine=vllm")

    def run(self, params: RealParams, backend: str = "host",
            progress: Progress | None = None) -> LabResult:
        from workbench.labs.vllm_runs import report

        mod = importlib.import_module(f"workbench.labs.vllm_runs.{MODULES[self.name]}")
        rec, md = report.REPORTS[self.name](mod.run(backend, quick=params.quick))
        return LabResult(rec, md, tables=rec.results)


def for_engine(name: str, text: dict[str, str]) -> RealVllmLab | None:
    """The real-vLLM lab when ``engine=vllm`` is asked of a lab that has one, else None."""
    if text.get("engine", "").strip().lower() != "vllm" or name not in MODULES:
        return None
    return RealVllmLab(name)
