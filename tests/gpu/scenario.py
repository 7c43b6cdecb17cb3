"""One alloc/free scenario over a pool, shared by the fast-path tests: positive sizes allocate
that many blocks, negative ones free the oldest live allocation."""

from __future__ import annotations

from collections.abc import Iterable


def run_sizes(kv, sizes: Iterable[int], catch: bool = False) -> tuple[list, list[list[int]]]:
    """Each op's outcome: the number of ids allocated (None when refused), ``"free"``, or, with
    ``catch``, the error an op raised as ``"Type: message"`` (the test compares it); and the
    allocations still live at the end."""
    live: list[list[int]] = []
    outcome: list = []
    for n in sizes:
        try:
            if n < 0 and live:
                kv.free(live.pop(0))
                outcome.append("free")
            elif n > 0:
                ids = kv.alloc(n)
                outcome.append(None if ids is None else len(ids))
                if ids is not None:
                    live.append(ids)
        except Exception as err:  # noqa: BLE001 - the error itself is compared
            if not catch:
                raise
            outcome.append(f"{type(err).__name__}: {err}")
    return outcome, live
