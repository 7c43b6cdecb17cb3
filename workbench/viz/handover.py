"""Figures of KV leaving the GPU (chapter 10): retrieve-vs-recompute curves per tier, and a PD
run's handovers as a timeline (prefill, link queue, transfer, decode) per request."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from workbench.pd.phases import phases
from workbench.viz.style import FONT, HANDOVER_COLORS

PHASE_COLORS = HANDOVER_COLORS


def crossover_figure(rows: list[dict[str, float]], title: str = "retrieve or recompute?"):
    fig = go.Figure()
    x = [r["tokens"] for r in rows]
    for key in [k for k in rows[0] if k != "tokens"]:
        fig.add_scatter(x=x, y=[r[key] * 1e3 for r in rows], name=key, mode="lines+markers",
                        line=dict(width=3 if key == "recompute" else 2,
                                  dash="solid" if key == "recompute" else "dash"))
    fig.update_layout(title=title, font=FONT, xaxis_title="prompt tokens", xaxis_type="log",
                      yaxis_title="ms to have the prompt's KV", yaxis_type="log", height=420)
    return fig


def handover_figure(result: Any, limit: int = 12, title: str = "PD handovers") -> go.Figure:
    """One row per request (the first ``limit`` by arrival), one bar per phase, in seconds."""
    reqs = sorted((r for r in result.requests if r.first_token is not None),
                  key=lambda r: r.arrival)[:limit]
    fig = go.Figure()
    seen: set[str] = set()
    for r in reqs:
        h = result.handovers[r.rid]
        ph = phases(r, result.prefill_copies[r.rid], h.sent, h.landed)
        ph["decode"] = r.finish - r.first_token
        start = r.arrival
        for name, dur in ph.items():
            fig.add_bar(y=[f"req {r.rid} ({r.group})"], x=[dur], base=[start], orientation="h",
                        marker_color=PHASE_COLORS[name], name=name, legendgroup=name,
                        showlegend=name not in seen,
                        hovertemplate=f"{name}: {dur * 1e3:.1f} ms<extra></extra>")
            seen.add(name)
            start += dur
    fig.update_layout(title=title, font=FONT, barmode="overlay", xaxis_title="time (s)",
                      yaxis=dict(autorange="reversed"), height=140 + 26 * max(len(reqs), 1))
    return fig
