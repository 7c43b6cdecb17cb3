"""Helpers the lab reports share: a latency cell for Markdown tables, seconds as rounded
milliseconds, the sweep rows without their per-repeat detail, and the verdict read from
per-seed checks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

P50_P95_P99 = ("p50", "p95", "p99")
P50_P99 = ("p50", "p99")


def lat_cell(d: Mapping[str, float], keys: Sequence[str] = P50_P95_P99) -> str:
    """Percentiles in ms as one table cell, e.g. ``1,204 / 1,880 / 2,013``."""
    return " / ".join(f"{d[k]:,.0f}" for k in keys)


def ms_or_none(x: float, digits: int = 1) -> float | None:
    """Seconds as milliseconds rounded to ``digits``; NaN (nothing measured) becomes None."""
    return None if x != x else round(x * 1e3, digits)


def without_repeats(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each sweep row less its ``repeats`` list: the pooled row a table or record shows."""
    return [{k: v for k, v in r.items() if k != "repeats"} for r in rows]


def checks_verdict(found: Iterable[Mapping[str, bool]]) -> str:
    """``supported`` when every check of every seed holds; else point at the failing checks."""
    return "supported" if all(all(f.values()) for f in found) else "refuted: see kv.checks"
