"""Prefix ownership per VMM page: who keeps each page mapped (seed 001 §6).

For every page id a stacked bar: blocks held by running requests (ref > 0), cached blocks nobody
holds (ref 0, waiting in the LRU) and free blocks. A page returns to the device only when the
first two are both zero — one cached block is enough to keep it.
"""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.units import MiB
from workbench.viz.style import FONT, OK, STATE_COLORS, WARN, WHITE


def ownership_figure(result, step: int | None = None) -> go.Figure:
    """Stacked bars per page at ``step`` of a :func:`~workbench.viz.scenarios.prefix_sharing`
    result, with mapped vs held memory in the title."""
    i = len(result.ownership) - 1 if step is None else max(0, min(step, len(result.ownership) - 1))
    own = result.ownership[i]
    pages = list(range(len(own)))
    fig = go.Figure()
    for k, (name, color) in enumerate((("held by requests (ref > 0)", OK),
                                       ("cached, nobody holds (ref 0)", WARN),
                                       ("free", STATE_COLORS["free"]))):
        fig.add_trace(go.Bar(x=pages, y=[o[k] for o in own], name=name, marker_color=color,
                             hovertemplate="page %{x}: %{y} blocks<extra>" + name + "</extra>"))
    mapped, held = result.mapped_live_bytes[i]
    pinned = sum(1 for h, c, _ in own if c and not h)
    label = result.rec.steps[i].label if result.rec.steps else ""
    fig.update_layout(
        barmode="stack", font=FONT, height=330, plot_bgcolor=WHITE,
        title=(f"Ownership per VMM page — {label}<br><sup>mapped {mapped / MiB:.0f} MiB, held by "
               f"requests {held / MiB:.0f} MiB; {pinned} page(s) kept mapped only by cached "
               f"blocks</sup>"),
        xaxis=dict(title="VMM page id", dtick=1), yaxis=dict(title="blocks"),
        margin=dict(l=60, r=10, t=70, b=40), legend=dict(orientation="h", y=-0.25))
    return fig


def update_ownership(fig, result, step: int | None) -> None:
    new = ownership_figure(result, step)
    with fig.batch_update():
        for old, tr in zip(fig.data, new.data, strict=True):
            old.y = tr.y
        fig.layout.title = new.layout.title
