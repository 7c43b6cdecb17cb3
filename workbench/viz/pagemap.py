"""The page map: every page id of every pool as one cell, coloured by state or by owner.

Pools sit one above the other (one band of rows each), so pools sharing a device read as one
picture of who holds physical memory.
"""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.viz.style import FONT, STATE_COLORS, WHITE, discrete_scale, pool_color
from workbench.viz.trace import MAPPED, STATES, Recording


def _grid(rec: Recording, states: dict[str, list[str]], width: int, color_by: str):
    """z codes, hover texts and y labels for the stacked pool bands."""
    z: list[list[float | None]] = []
    text: list[list[str]] = []
    ylabels: list[str] = []
    pools = list(rec.pools)
    for k, name in enumerate(pools):
        st = states[name]
        rows = -(-len(st) // width)
        for r in range(rows):
            zr: list[float | None] = []
            tr: list[str] = []
            for c in range(width):
                p = r * width + c
                if p >= len(st):
                    zr.append(None)
                    tr.append("")
                    continue
                s = st[p]
                if color_by == "owner":
                    zr.append(float(k + 1) if s in MAPPED else 0.0)
                else:
                    zr.append(float(STATES.index(s)))
                tr.append(f"{name} · page {p} · {s}")
            z.append(zr)
            text.append(tr)
            last = min(len(st), (r + 1) * width) - 1  # the row's page ids, said in full
            ylabels.append(f"{name} {r * width}-{last}" if last > r * width else f"{name} {last}")
        if k < len(pools) - 1:  # a blank row between pools
            z.append([None] * width)
            text.append([""] * width)
            ylabels.append(" " * (k + 1))
    return z, text, ylabels


def _scale(rec: Recording, color_by: str):
    if color_by == "owner":
        colors = [STATE_COLORS["free"]] + [pool_color(i) for i in range(len(rec.pools))]
    else:
        colors = [STATE_COLORS[s] for s in STATES]
    return discrete_scale(colors), len(colors)


def _title(label: str) -> str:
    """Steps labelled "step k: ..." (the scenarios) read as they are; other labels get "at"."""
    return f"Page map — {label}" if label.startswith("step ") else f"Page map — at: {label}"


def page_map(rec: Recording, step: int | None = None, *, width: int = 32,
             color_by: str = "state", title: str | None = None) -> go.Figure:
    """The page map after ``step``. ``color_by`` is "state" or "owner" (mapped pages take their
    pool's colour, unmapped ones stay grey)."""
    states = rec.states_at(step)
    z, text, ylabels = _grid(rec, states, width, color_by)
    scale, n = _scale(rec, color_by)
    heat = go.Heatmap(z=z, text=text, hoverinfo="text", colorscale=scale, zmin=-0.5,
                      zmax=n - 0.5, xgap=1, ygap=1, showscale=False, name="pages")
    fig = go.Figure(heat)
    # Legend entries: one invisible marker per state (or pool) so the colours are named.
    names = ([("unmapped", STATE_COLORS["free"])]
             + [(p, pool_color(i)) for i, p in enumerate(rec.pools)]
             if color_by == "owner" else [(s, STATE_COLORS[s]) for s in STATES])
    for label, color in names:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label,
                                 marker=dict(symbol="square", size=12, color=color)))
    label = rec.steps[step].label if rec.steps and step is not None else "end"
    fig.update_layout(
        title=title or _title(label), font=FONT, height=150 + 24 * len(z),
        margin=dict(l=110, r=10, t=80, b=40), plot_bgcolor=WHITE,
        xaxis=dict(title="page id (column)", showgrid=False, zeroline=False),
        yaxis=dict(autorange="reversed", tickmode="array", tickvals=list(range(len(z))),
                   ticktext=ylabels, showgrid=False, zeroline=False),
        legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom", font=dict(size=10)))
    return fig


def update_page_map(fig, rec: Recording, step: int | None, *, width: int = 32,
                    color_by: str = "state") -> None:
    """Redraw ``fig`` (made by :func:`page_map`) in place: the live widget calls this."""
    states = rec.states_at(step)
    z, text, _ = _grid(rec, states, width, color_by)
    label = rec.steps[step].label if rec.steps and step is not None else "end"
    with fig.batch_update():
        fig.data[0].z = z
        fig.data[0].text = text
        fig.layout.title.text = _title(label)
