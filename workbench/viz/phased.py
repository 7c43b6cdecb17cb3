"""A sequence diagram whose messages are grouped into phases (e.g. fault -> state change ->
cleanup -> fallback): :func:`~workbench.viz.sequence.sequence_figure` plus a shaded band and a
label per run of messages in the same phase. Any message with a ``phase`` attribute (or dict
key) works; messages without one fall in ``"normal"``, which gets no band."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import plotly.graph_objects as go

from workbench.viz.sequence import sequence_figure
from workbench.viz.style import EDGE, TINTS

PHASE_COLORS = {"fault": TINTS["red"], "state": TINTS["yellow"], "cleanup": TINTS["green"],
                "fallback": TINTS["blue"]}


def phase_of(m: Any) -> str:
    return str(m.get("phase", "normal") if isinstance(m, dict) else getattr(m, "phase", "normal"))


def phase_runs(messages: Sequence[Any]) -> list[tuple[str, int, int]]:
    """``(phase, first, last)`` for each run of consecutive messages in one phase (1-based rows,
    the rows :func:`sequence_figure` draws them on)."""
    runs: list[tuple[str, int, int]] = []
    for k, m in enumerate(messages, 1):
        p = phase_of(m)
        if runs and runs[-1][0] == p:
            runs[-1] = (p, runs[-1][1], k)
        else:
            runs.append((p, k, k))
    return runs


def phased_sequence_figure(messages: Iterable[Any], participants: Sequence[str] | None = None,
                           title: str = "fault -> state -> cleanup -> fallback") -> go.Figure:
    msgs = list(messages)
    fig = sequence_figure(msgs, participants, title)
    width = len(participants or {p for m in msgs for p in (getattr(m, "src", None),
                                                           getattr(m, "dst", None))})
    for phase, first, last in phase_runs(msgs):
        color = PHASE_COLORS.get(phase)
        if color is None:
            continue
        fig.add_shape(type="rect", x0=-0.7, x1=max(width, 2) - 0.3, y0=-first + 0.45,
                      y1=-last - 0.45, fillcolor=color, opacity=0.55, line_width=0,
                      layer="below")
        fig.add_annotation(x=-0.65, y=-first + 0.3, text=f"<i>{phase}</i>", showarrow=False,
                           xanchor="left", font=dict(size=9, color=EDGE))
    return fig
