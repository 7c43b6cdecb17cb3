"""What every bench's repeated timings share: the one summary they report (median, p10, p90 and
n) and the collector paused around each measured run."""

from __future__ import annotations

import gc

from workbench.percentiles import LINEAR, NEAREST, spread


def deciles(xs: list[float]) -> dict:
    """median, p10, p90 and n (p10/p90: the 1st and 9th deciles, interpolated between ranks as
    ``numpy.percentile`` does; the value itself for n=1; all None for no value)."""
    return spread(xs, LINEAR)


def nearest_deciles(xs: list[float]) -> dict:
    """median, and p10/p90 by nearest rank: the definition docs/gpu.md's figures used."""
    return spread(xs, NEAREST)


class PausedGC:
    """Collect, then pause the garbage collector for one measured run."""

    def __enter__(self):
        gc.collect()
        gc.disable()

    def __exit__(self, *exc):
        gc.enable()
