"""Helpers the lab reports share: a latency cell and the seeds-agree table for Markdown, a
grouped bar figure, seconds as rounded milliseconds, the sweep rows without their per-repeat
detail, a record's TTFT percentiles, the verdict read from per-seed checks, and the one pass
that writes every table cell of a report as a reader reads it (:func:`tidy_tables`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
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


def agreement_rows(expect: Iterable[tuple[str, str | Sequence[str]]],
                   found: Sequence[Mapping[str, bool]],
                   head: str = "the seed expects") -> list[str]:
    """The Markdown table of what the seed expects and how many seeds agree: one row per
    ``(text, key or keys)``; a seed agrees when every named check of its ``found`` holds."""
    lines = [f"| {head} | seeds that agree |", "|---|---|"]
    for text, keys in expect:
        names = (keys,) if isinstance(keys, str) else keys
        agree = sum(all(f[k] for k in names) for f in found)
        lines.append(f"| {text} | {agree}/{len(found)} |")
    return lines


def ttft_percentiles(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """A record's ``ttft`` field from table rows that carry ``ttft_p50_ms`` .. ``ttft_p99_ms``."""
    return {k: {f"{q}_ms": r[f"ttft_{q}_ms"] for q in P50_P95_P99} for k, r in rows.items()}


def grouped_bars(go: Any, rows: Sequence[Mapping[str, Any]], series: str,
                 x: str | Callable[[Mapping[str, Any]], Any],
                 y: str | Callable[[Mapping[str, Any]], Any],
                 order: Iterable[Any] | None = None, **layout: Any) -> Any:
    """A grouped bar figure: one bar series per value of ``rows[series]`` (in ``order``, else as
    first seen), bars at ``x`` with heights ``y`` (a row key or a function of the row)."""
    fx = x if callable(x) else (lambda r: r[x])
    fy = y if callable(y) else (lambda r: r[y])
    fig = go.Figure()
    for name in (dict.fromkeys(r[series] for r in rows) if order is None else order):
        sel = [r for r in rows if r[series] == name]
        fig.add_bar(x=[fx(r) for r in sel], y=[fy(r) for r in sel], name=name)
    fig.update_layout(barmode="group", **layout)
    return fig


# A Python value written into a cell as its repr: a dict, list or tuple, True/False/None.
_LITERAL = re.compile(r"^(\{.*\}|\[.*\]|\(.*\)|True|False|None)$")
# A spread of one value (one repeat): ``1.263 [1.263-1.263]``, ``2.1x [2.1-2.1]``.
_ONE_VALUE_SPREAD = re.compile(r"(-?[\d,]+(?:\.\d+)?)(\s?[a-zA-Z%]*) \[\1-\1\]")


def tidy_cell(text: str) -> str:
    """One Markdown table cell: a Python repr becomes the value in words
    (:func:`workbench.viz.labfigs.cell`), and a min-max spread of one value its value alone."""
    from workbench.viz.labfigs import cell

    text = _ONE_VALUE_SPREAD.sub(r"\1\2", text)
    stripped = text.strip()
    if _LITERAL.match(stripped):
        try:
            value = ast.literal_eval(stripped)
        except (ValueError, SyntaxError):
            return text
        return f" {cell(value)} " if text.startswith(" ") else cell(value)
    return text


def tidy_tables(markdown: str) -> str:
    """Every cell of every pipe table in ``markdown`` through :func:`tidy_cell`; prose and code
    blocks stay as written. Each lab's report goes through this once (``LabResult``)."""
    out, in_code = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("|") and line.rstrip().endswith("|") \
                and not set(line) <= set("|-: "):
            cells = line.rstrip()[1:-1].split("|")
            line = "|" + "|".join(tidy_cell(c) for c in cells) + "|"
        out.append(line)
    return "\n".join(out)
