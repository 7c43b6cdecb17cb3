"""The transfer-faults lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import QUICK
from workbench.labs.transfer_faults.report import figures, markdown, record, row_table
from workbench.labs.transfer_faults.sim import run_rows
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


class TransferFaultsLab(Lab):
    name = "transfer-faults"
    description = ("seed 003 E8's seven cache/transfer faults: fault -> state -> cleanup -> "
                   "fallback, each row's correctness criterion checked, with and without guard")
    params_type = TransferFaultsParams
    backends = ("sim",)

    def run(self, params: TransferFaultsParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        cases = run_rows(params)
        table = row_table(cases)
        if progress:
            progress(len(table), len(table), "fault rows")
        slim = [{k: v for k, v in r.items() if k != "messages"} for r in table]
        return LabResult(record(params, table, backend), markdown(table),
                         tables={"rows": slim}, figures=figures(cases))
