"""The one percentile helper, over numpy. Two named definitions, because published figures
depend on each:

* ``LINEAR`` (numpy's default, the same as ``statistics.quantiles(method="inclusive")``):
  interpolated between the two nearest ranks. The serving latencies, the mini-engine benches'
  ``deciles`` and the load client use it.
* ``NEAREST``: the sample at rank ``round((n - 1) q)`` (half to even), no interpolation. The
  p10/p90 of ``bench vmm``'s per-round ratios in docs/gpu.md were computed this way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LINEAR = "linear"
NEAREST = "nearest"


def percentile(values: Sequence[float], q: float, method: str = LINEAR) -> float:
    """The ``q``-th percentile (``q`` in 0..100) of ``values``; NaN for no value."""
    if len(values) == 0:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=float), q, method=method))


def percentiles(values: Sequence[float], qs: Sequence[float],
                method: str = LINEAR) -> list[float]:
    if len(values) == 0:
        return [float("nan")] * len(qs)
    return [float(x) for x in np.percentile(np.asarray(values, dtype=float), qs, method=method)]


def spread(values: Sequence[float], method: str = LINEAR) -> dict:
    """median, p10, p90 and n (the median always interpolated); all None for no value."""
    if len(values) == 0:
        return {"median": None, "p10": None, "p90": None, "n": 0}
    p10, p90 = percentiles(values, (10, 90), method)
    return {"median": float(np.median(np.asarray(values, dtype=float))), "p10": p10,
            "p90": p90, "n": len(values)}
