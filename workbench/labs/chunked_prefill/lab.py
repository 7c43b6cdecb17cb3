"""The chunked-prefill lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.chunked_prefill.report import figures, markdown, record
from workbench.labs.chunked_prefill.sim import sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import LONG_SHARE, QUICK, RATES, REQUESTS, SEED
from workbench.labs.kit.report import without_repeats
from workbench.ranges import Ints, Num, Spec


@dataclass(slots=True)
class ChunkedPrefillParams:
    budgets: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)  # chunked-on token budgets
    rates: tuple[float, ...] = (2.0, 4.0)  # req/s of the whole mix
    long_share: float = 0.2  # share of long prompts (4096/128) in the mix
    num_requests: int = 600  # per configuration, rate and repeat
    repeats: int = 2
    seed: int = 0
    itl_slo_ms: float = 150.0  # a decoding request streams smoothly if no gap exceeds this
    quick: bool = False  # rate 4 only, budgets 512 and 2048 against off, one repeat
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "budgets": Ints(16, 65536), "rates": RATES, "long_share": LONG_SHARE,
        "num_requests": REQUESTS, "repeats": Num(int, 1, 20), "seed": SEED,
        "itl_slo_ms": Num(float, 0.1, 60000.0, "ms"), "quick": QUICK,
    }


class ChunkedPrefillLab(Lab):
    name = "chunked-prefill"
    description = ("long/short mix with chunked prefill off vs on at several token budgets: "
                   "long prompts' TTFT against decoding requests' ITL, and goodput")
    params_type = ChunkedPrefillParams
    backends = ("sim",)

    def run(self, params: ChunkedPrefillParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        rows = sweep(params, progress)
        table = without_repeats(rows)
        return LabResult(record(params, rows, backend), markdown(params, table),
                         tables={"configs": table}, figures=figures(table))
