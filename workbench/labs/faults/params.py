"""The faults lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import QUICK, REPEATS
from workbench.ranges import Flag, Num, Opt, Spec


@dataclass(slots=True)
class FaultsParams:
    quick: bool = False  # each case once instead of three times
    tp: int = 2  # TP ranks of the faulty pool (the last one is the victim)
    repeats: int | None = None  # None: 1 (quick) or 3
    coordinator_kill: bool = True  # host/gpu: also SIGKILL a coordinator and collect its dir
    gpus: int | None = None  # gpu: GPUs the ranks spread over; None: one per rank
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "tp": Num(int, 2, 8, "ranks"), "repeats": REPEATS,
        "coordinator_kill": Flag(), "gpus": Opt(Num(int, 1, 8)),
    }
