"""The transfer-faults lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.resolve import LabRun
from workbench.labs.transfer_faults.params import TransferFaultsParams
from workbench.labs.transfer_faults.report import figures, markdown, record, row_table
from workbench.labs.transfer_faults.sim import run_rows


def run_sim(params: TransferFaultsParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    cases = run_rows(params)
    table = row_table(cases)
    if progress:
        progress(len(table), len(table), "fault rows")
    slim = [{k: v for k, v in r.items() if k != "messages"} for r in table]
    return LabResult(record(params, table, run.backend), markdown(table),
                     tables={"rows": slim}, figures=figures(cases))


class TransferFaultsLab(Lab):
    name = "transfer-faults"
    description = ("seed 003 E8's seven cache/transfer faults: fault -> state -> cleanup -> "
                   "fallback, each row's correctness criterion checked, with and without guard")
    params_type = TransferFaultsParams
    runners = {"simulated": run_sim}
