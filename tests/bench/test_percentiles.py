"""The one percentile helper keeps each published definition: interpolated (numpy's default,
``statistics.quantiles(method="inclusive")``) and bench vmm's nearest rank."""

from __future__ import annotations

import math
import statistics

from hypothesis import given
from hypothesis import strategies as st

from workbench.bench.stats import deciles
from workbench.mini.client import percentile as client_percentile
from workbench.percentiles import LINEAR, NEAREST, percentile, spread

SAMPLES = st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1,
                   max_size=60)


def _nearest_rank(xs: list[float], q: float) -> float:
    """bench vmm's definition before the helper: the sample at round((n-1) q)."""
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, round(q * (len(ys) - 1))))]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


@given(SAMPLES, st.integers(min_value=1, max_value=99))
def test_linear_is_statistics_inclusive(xs, q):
    if len(xs) > 1:
        ref = statistics.quantiles(xs, n=100, method="inclusive")[q - 1]
        assert _close(percentile(xs, q, LINEAR), ref)
    assert client_percentile(xs, q) == percentile(xs, q)


@given(SAMPLES, st.sampled_from([0.1, 0.5, 0.9]))
def test_nearest_is_bench_vmms_rank(xs, q):
    assert percentile(xs, q * 100, NEAREST) == _nearest_rank(xs, q)


@given(SAMPLES)
def test_deciles_and_spread(xs):
    d = deciles(xs)
    assert d["n"] == len(xs) and _close(d["median"], statistics.median(xs))
    if len(xs) > 1:
        q = statistics.quantiles(xs, n=10, method="inclusive")
        assert _close(d["p10"], q[0]) and _close(d["p90"], q[8])
    else:
        assert d["p10"] == d["p90"] == xs[0]
    s = spread(xs, NEAREST)
    assert (s["p10"], s["p90"]) == (_nearest_rank(xs, 0.1), _nearest_rank(xs, 0.9))


def test_no_values():
    assert math.isnan(percentile([], 50))
    assert deciles([]) == {"median": None, "p10": None, "p90": None, "n": 0}
