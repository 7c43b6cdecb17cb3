"""The idle-footprint lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.idle_footprint.report import markdown, record
from workbench.labs.idle_footprint.sim import sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import QUICK, SEED
from workbench.ranges import Spec


@dataclass(slots=True)
class IdleFootprintParams:
    quick: bool = False  # 500 requests instead of 2,500
    seed: int = 0
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED,
    }


class IdleFootprintLab(Lab):
    name = "idle-footprint"
    description = ("idle footprint after prefix-heavy traffic vs the packed floor (page-aware vs "
                   "LRU eviction; vLLM-like and SGLang-like)")
    params_type = IdleFootprintParams
    backends = ("sim",)

    def run(self, params: IdleFootprintParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        rows = sweep(params.quick, params.seed, progress)
        return LabResult(record(rows, params.seed, backend), markdown(rows), tables={"rows": rows})
