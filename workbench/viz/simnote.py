"""Say so when a chapter cell runs on the simulator whatever ``backend`` is.

Some lessons exist only as simulations (message faults between simulated TP workers, a modelled
cluster, a tier cost model); on ``backend="gpu"`` or ``"host"`` their cells still run on the
simulator. :func:`simulated_here` prints one line saying that, so a GPU run never passes a
simulated figure off as a measured one. On ``sim`` it prints nothing.
"""

from __future__ import annotations

from workbench.backends import capabilities

PREFIX = "[simulated]"


def simulated_here(backend: str, what: str) -> str | None:
    """Print (and return) the note for a cell that runs ``what`` on the simulator."""
    if capabilities(backend).simulated:
        return None
    note = f"{PREFIX} {what} runs on the simulator; backend={backend!r} does not change this cell."
    print(note)
    return note


def skipped_here(backend: str, what: str, why: str) -> str | None:
    """Print (and return) the note for a part of a cell left out on ``backend``."""
    if capabilities(backend).simulated:
        return None
    note = f"[skipped on {backend}] {what}: {why}."
    print(note)
    return note
