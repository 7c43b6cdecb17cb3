"""The transfer-faults lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import QUICK
from workbench.pd.faults_store import ROWS
from workbench.ranges import Choices, Flag, Spec


@dataclass(slots=True)
class TransferFaultsParams:
    rows: tuple[str, ...] = tuple(ROWS)  # which fault rows, in the seed's order
    unsafe: bool = True  # also run each row without its guards (the control)
    quick: bool = False  # the same: every row is a few milliseconds
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "rows": Choices(tuple(ROWS)), "unsafe": Flag(), "quick": QUICK,
    }
