"""Mapped and reserved bytes per pool over the steps of a recording, with each pool's limit."""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.units import GiB
from workbench.viz.style import FONT, INK, LIMIT, WHITE, pool_color
from workbench.viz.trace import Recording


def bytes_figure(rec: Recording, step: int | None = None, *, capacity: int | None = None,
                 title: str = "Physical memory per pool") -> go.Figure:
    """Lines per pool: mapped (solid), reserved (dashed), limit (dotted, only while one is set);
    ``step`` draws a cursor; ``capacity`` a labelled device line."""
    series = rec.series()
    x = list(range(len(rec.steps)))
    labels = rec.labels()
    fig = go.Figure()
    for i, (name, s) in enumerate(series.items()):
        c = pool_color(i)
        fig.add_trace(go.Scatter(x=x, y=[v / GiB for v in s["mapped"]], name=f"{name} mapped",
                                 mode="lines", line=dict(color=c, width=2.5), text=labels,
                                 hovertemplate="%{text}<br>%{y:.2f} GiB"))
        fig.add_trace(go.Scatter(x=x, y=[v / GiB for v in s["reserved"]],
                                 name=f"{name} reserved", mode="lines",
                                 line=dict(color=c, width=1.5, dash="dash"), text=labels,
                                 hovertemplate="%{text}<br>%{y:.2f} GiB"))
        if any(s["limit"]):  # steps before the limit was set draw nothing (0 = no limit)
            fig.add_trace(go.Scatter(x=x, y=[v / GiB if v else None for v in s["limit"]],
                                     name=f"{name} limit", mode="lines",
                                     line=dict(color=c, width=1, dash="dot"), text=labels,
                                     hovertemplate="%{text}<br>limit %{y:.2f} GiB"))
    shapes = []
    notes = []
    if capacity:
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, y0=capacity / GiB,
                           y1=capacity / GiB, line=dict(color=LIMIT, width=1.5)))
        notes.append(dict(xref="paper", x=1, y=capacity / GiB, yanchor="bottom", xanchor="right",
                          text="device capacity", showarrow=False,
                          font=dict(size=10, color=LIMIT)))
    shapes.append(_cursor(step))
    fig.update_layout(title=title, font=FONT, height=360, shapes=shapes, annotations=notes,
                      xaxis=dict(title="step"), yaxis=dict(title="GiB", rangemode="tozero"),
                      margin=dict(l=60, r=10, t=50, b=40), plot_bgcolor=WHITE,
                      legend=dict(font=dict(size=10)))
    return fig


def _cursor(step: int | None) -> dict:
    x = step if step is not None else 0
    return dict(type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1,
                line=dict(color=INK, width=1, dash="dot"),
                visible=step is not None)


def move_cursor(fig, step: int | None) -> None:
    shapes = list(fig.layout.shapes)
    if shapes:
        shapes[-1] = _cursor(step)
        fig.layout.shapes = shapes


def instances_figure(timeline: dict[str, dict[str, list]], *, capacity: int | None = None,
                     title: str = "Mapped KV memory per instance") -> go.Figure:
    """``{instance: {"t": [...], "mapped_bytes": [...], ...}}`` (the engines' memory timeline)
    as one line per instance over simulated seconds, with their sum."""
    fig = go.Figure()
    total: dict[float, float] = {}
    for i, (name, d) in enumerate(timeline.items()):
        fig.add_trace(go.Scatter(x=d["t"], y=[b / GiB for b in d["mapped_bytes"]], name=name,
                                 mode="lines", line=dict(color=pool_color(i), width=2)))
        for t, b in zip(d["t"], d["mapped_bytes"], strict=True):
            total[t] = total.get(t, 0.0) + b
    ts = sorted(total)
    fig.add_trace(go.Scatter(x=ts, y=[total[t] / GiB for t in ts], name="sum", mode="lines",
                             line=dict(color=INK, width=1, dash="dot")))
    if capacity:
        fig.add_hline(y=capacity / GiB, line=dict(color=LIMIT, width=1.5),
                      annotation_text="KV budget")
    fig.update_layout(title=title, font=FONT, height=340, plot_bgcolor=WHITE,
                      xaxis=dict(title="simulated seconds"), yaxis=dict(title="GiB"),
                      margin=dict(l=60, r=10, t=50, b=40))
    return fig
