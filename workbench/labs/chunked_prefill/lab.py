"""The chunked-prefill lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.labs.chunked_prefill.params import ChunkedPrefillParams
from workbench.labs.chunked_prefill.report import figures, markdown, record
from workbench.labs.chunked_prefill.sim import sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.report import without_repeats
from workbench.labs.kit.resolve import LabRun


def run_sim(params: ChunkedPrefillParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    rows = sweep(params, progress)
    table = without_repeats(rows)
    return LabResult(record(params, rows, run.backend), markdown(params, table),
                     tables={"configs": table}, figures=figures(table))


class ChunkedPrefillLab(Lab):
    name = "chunked-prefill"
    description = ("long/short mix with chunked prefill off vs on at several token budgets: "
                   "long prompts' TTFT against decoding requests' ITL, and goodput")
    params_type = ChunkedPrefillParams
    runners = {"simulated": run_sim}
