"""Chapter 08's measuring tools: run order (blocked or alternating), a background load that makes
drift visible, percentiles of small samples, and figures for distributions and spreads; plus the
unified result table (seed 003 §12) of a lab record as rows.

Timings come from a real clock (``time.perf_counter``) unless a test passes its own; nothing here
invents a number.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any, NamedTuple

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.errors import ConfigError
from workbench.viz.style import FONT, SHADE, WHITE, pool_color

ORDERS = ("blocked", "alternate")


def schedule(order: str, rounds: int, labels: Sequence[str] = ("A", "B")) -> list[str]:
    """The run order: ``blocked`` runs every A then every B; ``alternate`` runs one of each per
    round and swaps which goes first every round (A B, B A, A B, ...)."""
    if order not in ORDERS:
        raise ConfigError(f"order {order!r}", "is not a run order", f"use one of {ORDERS}")
    if rounds < 1:
        raise ConfigError(f"rounds={rounds}", "must be at least 1", "pass rounds >= 1")
    if order == "blocked":
        return [lab for lab in labels for _ in range(rounds)]
    out: list[str] = []
    for r in range(rounds):
        out += list(labels) if r % 2 == 0 else list(reversed(labels))
    return out


class Timing(NamedTuple):
    index: int  # position in the run order
    label: str
    seconds: float
    loaded: bool  # the background load was on during this run


class BackgroundLoad:
    """A thread that spins in pure Python: every run in this interpreter now shares the GIL with
    it, the way a noisy neighbour shares a machine. While it runs, the interpreter switches
    threads every ``switch_s`` (finer than the default 5 ms, so the share is steadier).
    ``start``/``stop`` are idempotent."""

    def __init__(self, switch_s: float = 0.0002) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._switch_s, self._saved = switch_s, sys.getswitchinterval()

    def _spin(self) -> None:
        x = 0
        while not self._stop.is_set():
            for _ in range(2000):
                x += 1

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._saved = sys.getswitchinterval()
            sys.setswitchinterval(self._switch_s)
            self._thread = threading.Thread(target=self._spin, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            sys.setswitchinterval(self._saved)

    @property
    def on(self) -> bool:
        return self._thread is not None


def time_runs(fns: dict[str, Callable[[], Any]], order: str, rounds: int, *,
              load_from: int | None = None, load: BackgroundLoad | None = None,
              clock: Callable[[], float] = time.perf_counter) -> list[Timing]:
    """Run ``fns`` in ``schedule(order, rounds, fns)``, timing each run with ``clock``; the load
    is switched on before run ``load_from`` and stays on to the end (then switched off)."""
    if load_from is not None and load is None:
        raise ConfigError("load_from without a load", "nothing would be switched on",
                          "pass load=BackgroundLoad() too")
    out: list[Timing] = []
    try:
        for i, label in enumerate(schedule(order, rounds, list(fns))):
            if load is not None and load_from is not None and i >= load_from:
                load.start()
            t0 = clock()
            fns[label]()
            out.append(Timing(i, label, clock() - t0, load is not None and load.on))
    finally:
        if load is not None:
            load.stop()
    return out


def median_ratio(timings: Sequence[Timing], num: str = "B", den: str = "A") -> float:
    """The median over pairs of ``num_k / den_k`` (the k-th run of each): in an alternating order
    a pair ran side by side, under the same conditions."""
    nums = [t.seconds for t in timings if t.label == num]
    dens = [t.seconds for t in timings if t.label == den]
    return statistics.median(a / b for a, b in zip(nums, dens, strict=True))


def subset_percentiles(xs: Sequence[float], n: int, k: int, q: float = 99,
                       seed: int = 0) -> list[float]:
    """The ``q``-th percentile of ``k`` random subsets of ``n`` samples (without replacement):
    how much a percentile from ``n`` requests moves between equally valid runs."""
    a = np.asarray(xs, dtype=float)
    if not 1 <= n <= a.size:
        raise ConfigError(f"n={n}", f"must be between 1 and the {a.size} samples",
                          "pick a subset size the sample can supply")
    rng = np.random.default_rng(seed)
    return [float(np.percentile(rng.choice(a, n, replace=False), q)) for _ in range(k)]


# -- figures ---------------------------------------------------------------------------------
def cdf_figure(samples: dict[str, Sequence[float]], *, unit: str = "ms", log_x: bool = True,
               title: str = "Distribution (empirical CDF)") -> go.Figure:
    """One CDF line per sample, with its mean (dashed), p50 (dot) and p99 (diamond) marked."""
    fig = go.Figure()
    for i, (name, xs) in enumerate(samples.items()):
        a, c = np.sort(np.asarray(xs, dtype=float)), pool_color(i)
        y = np.arange(1, a.size + 1) / a.size
        fig.add_scatter(x=a, y=y, name=name, mode="lines", line=dict(color=c, width=2))
        p50, p99, mean = np.percentile(a, 50), np.percentile(a, 99), a.mean()
        fig.add_scatter(x=[p50, p99], y=[0.5, 0.99], mode="markers+text", showlegend=False,
                        marker=dict(color=c, size=10, symbol=["circle", "diamond"]),
                        text=[f"p50 {p50:,.0f}", f"p99 {p99:,.0f}"], textposition="middle right",
                        hovertemplate="%{text} " + unit + "<extra>" + name + "</extra>")
        fig.add_vline(x=mean, line=dict(color=c, dash="dash", width=1.5),
                      annotation_text=f"mean {mean:,.0f}", annotation_position="bottom right")
    fig.update_layout(title=title, font=FONT, height=380, plot_bgcolor=WHITE,
                      xaxis=dict(title=unit, type="log" if log_x else "linear"),
                      yaxis=dict(title="fraction of requests at or below", range=[0, 1.02]),
                      margin=dict(l=60, r=10, t=50, b=40))
    return fig


def timing_figure(runs: dict[str, Sequence[Timing]], *,
                  title: str = "The same work, two run orders") -> go.Figure:
    """One panel per run order: each run's time by its position; shaded where the load was on."""
    fig = make_subplots(rows=1, cols=len(runs), shared_yaxes=True,
                        subplot_titles=[f"{o}: B/A = {median_ratio(t):.2f}"
                                        for o, t in runs.items()])
    labels = sorted({t.label for ts in runs.values() for t in ts})
    for col, ts in enumerate(runs.values(), start=1):
        loaded = [t.index for t in ts if t.loaded]
        if loaded:
            fig.add_vrect(x0=min(loaded) - 0.5, x1=max(loaded) + 0.5, fillcolor=SHADE,
                          line_width=0, row=1, col=col)
        for i, lab in enumerate(labels):
            pts = [t for t in ts if t.label == lab]
            fig.add_scatter(x=[t.index for t in pts], y=[t.seconds * 1e3 for t in pts],
                            mode="markers", name=lab, legendgroup=lab, showlegend=col == 1,
                            marker=dict(color=pool_color(i), size=9), row=1, col=col)
    fig.update_layout(title=title, font=FONT, height=360, plot_bgcolor=WHITE,
                      margin=dict(l=60, r=10, t=70, b=40))
    fig.update_xaxes(title_text="run position")
    fig.update_yaxes(title_text="ms per run", rangemode="tozero", row=1, col=1)
    return fig


def spread_figure(rows: Sequence[dict], *, x: str, y: str, group: str,
                  title: str = "One number per run") -> go.Figure:
    """A strip plot: ``y`` of every row, one colour per ``group`` value, ``x`` across."""
    fig = go.Figure()
    for i, g in enumerate(dict.fromkeys(r[group] for r in rows)):
        pts = [r for r in rows if r[group] == g]
        fig.add_scatter(x=[r[x] for r in pts], y=[r[y] for r in pts], name=str(g),
                        mode="markers+lines", marker=dict(size=10, color=pool_color(i)))
    fig.update_layout(title=title, font=FONT, height=340, plot_bgcolor=WHITE,
                      xaxis=dict(title=x, type="category"), yaxis=dict(title=y),
                      margin=dict(l=60, r=10, t=50, b=40))
    return fig


# -- seed 003 §12 ----------------------------------------------------------------------------
def record_rows(record: Any, width: int = 90) -> list[tuple[str, str]]:
    """Each field of a lab record, in the unified table's order, with its value shortened to
    ``width`` characters; a field the run could not measure reads ``not measured``."""
    rows = []
    for f in fields(record):
        if f.name in ("manifest", "results", "schema"):
            continue
        v = getattr(record, f.name)
        text = "not measured" if v is None else v if isinstance(v, str) else json.dumps(
            v, default=str, separators=(",", ":"))
        rows.append((f.name, text if len(text) <= width else text[:width - 1] + "…"))
    return rows
