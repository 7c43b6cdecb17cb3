"""The chunked-prefill lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import LONG_SHARE, QUICK, RATES, REQUESTS, SEED
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
