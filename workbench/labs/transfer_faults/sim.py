"""Transfer-faults lab (seed 003 E8): the seed's seven fault rows on the simulated transfer path
(:mod:`workbench.pd.faults`, :mod:`workbench.pd.faults_store`). Each row is run with the guards
the seed's criterion needs (deferred free, leases, generations, namespaced keys, timeouts and a
bounded fallback, eviction that skips busy objects) and once without them, so the report shows
both that the criterion holds and which guard holds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.errors import ConfigError
from workbench.pd.faults import FaultCase
from workbench.pd.faults_store import ROWS

if TYPE_CHECKING:
    from workbench.labs.transfer_faults.params import TransferFaultsParams


def run_rows(p: TransferFaultsParams) -> list[tuple[FaultCase, FaultCase | None]]:
    bad = [r for r in p.rows if r not in ROWS]
    if bad or not p.rows:
        raise ConfigError(f"rows {bad or p.rows!r}", "are not fault rows of seed 003 E8",
                          f"use some of {', '.join(ROWS)}")
    return [(ROWS[r](True), ROWS[r](False) if p.unsafe else None) for r in p.rows]


