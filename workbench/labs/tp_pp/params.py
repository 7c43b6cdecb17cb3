"""The tp-pp lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import QUICK, REPEATS
from workbench.labs.kit.tp_pp_workers import GEO
from workbench.ranges import Num, Opt, Spec


@dataclass(slots=True)
class TpPpParams:
    quick: bool = False  # 2 repeats of 8 pages instead of 6 of 14
    tp: int = 2  # TP ranks (the TP, async and round-trip worker sets)
    pp: int = 2  # PP stages (the PP worker set: one TP rank per stage)
    pages: int | None = None  # page ids mapped and unmapped per repeat; None: 8 / 14
    repeats: int | None = None  # None: 2 (quick) or 6
    gpus: int | None = None  # gpu: GPUs the ranks spread over; None: one per rank
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "tp": Num(int, 2, 8, "ranks"), "pp": Num(int, 2, 8, "stages"),
        "pages": Opt(Num(int, 1, GEO.num_pages - 1)), "repeats": REPEATS,
        "gpus": Opt(Num(int, 1, 8)),
    }

    def ranks(self) -> int:
        """Worker processes alive at once (one worker set at a time)."""
        return max(self.tp, self.pp)
