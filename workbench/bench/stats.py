"""The one summary of repeated timings the benches report: median, p10, p90 and n."""

from __future__ import annotations

import statistics


def deciles(xs: list[float]) -> dict:
    """median, p10, p90 and n (p10/p90: the 1st and 9th deciles, interpolated between ranks as
    ``numpy.percentile`` does; the value itself for n=1; all None for no value)."""
    if not xs:
        return {"median": None, "p10": None, "p90": None, "n": 0}
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    return {"median": statistics.median(xs), "p10": q[0], "p90": q[8], "n": len(xs)}
