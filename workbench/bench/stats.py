"""The one summary of repeated timings the benches report: median, p10, p90 and n."""

from __future__ import annotations

from workbench.percentiles import LINEAR, spread


def deciles(xs: list[float]) -> dict:
    """median, p10, p90 and n (p10/p90: the 1st and 9th deciles, interpolated between ranks as
    ``numpy.percentile`` does; the value itself for n=1; all None for no value)."""
    return spread(xs, LINEAR)
