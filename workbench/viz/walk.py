"""Figures of one request's walk through an engine (chapter 05): its table, the pages under it.

* :func:`table_figure` — after one step: token positions → block table (vLLM) or
  ``req_to_token`` slots (SGLang) → the VMM page of each block;
* :func:`walk_page_map` — the pool's page map after that step, the request's pages ringed;
* :func:`footprint_figure` — per step: tokens with KV, token slots held, pages touched;
* :func:`walk_explorer` — all three behind a step slider (live), or the last step (static).

Everything is read from the :class:`~workbench.viz.lifecycle.Snapshot` list and the recording's
event trace, so a figure shows what the engine's objects held, not a re-computation.
"""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.core.geometry import KVGeometry
from workbench.viz.blocktable import VIEWS, block_table_figure
from workbench.viz.lifecycle import Snapshot, SteppedEngine
from workbench.viz.live import figure, is_live
from workbench.viz.pagemap import page_map, update_page_map
from workbench.viz.style import FONT, INK, PATH, WHITE
from workbench.viz.trace import Recording

RING = dict(symbol="square-open", size=18, color=INK, line=dict(width=2.5))


def table_figure(geo: KVGeometry, snap: Snapshot, view: str = "vllm") -> go.Figure:
    """The request's table after ``snap``'s step (an empty frame when it holds no KV)."""
    covered = min(snap.num_computed, len(snap.table) * geo.block_size)
    title = f"step {snap.step} · {snap.label}"
    if covered == 0:
        fig = go.Figure()
        fig.update_layout(title=title + f" — holds no KV ({snap.state})", font=FONT, height=390,
                          plot_bgcolor=WHITE, xaxis=dict(visible=False),
                          yaxis=dict(visible=False),
                          annotations=[dict(text="no block held", showarrow=False, x=0.5,
                                            y=0.5, xref="paper", yref="paper")])
        return fig
    fig = block_table_figure(geo, snap.table, covered, views=(view,), title=title)
    fig.update_layout(height=390)
    return fig


def _ring_xy(pages: list[int], width: int) -> tuple[list[int], list[int]]:
    ps = sorted(set(pages))
    return [p % width for p in ps], [p // width for p in ps]


def walk_page_map(rec: Recording, snap: Snapshot, *, width: int = 16) -> go.Figure:
    """The page map after ``snap``'s step; the request's pages are ringed."""
    fig = page_map(rec, snap.step, width=width,
                   title=f"Page map after step {snap.step} (ringed: our request's pages)")
    x, y = _ring_xy(snap.pages, width)
    fig.add_trace(go.Scatter(x=x, y=y, mode="markers", marker=RING, name="our request",
                             hoverinfo="skip"))
    return fig


def footprint(geo: KVGeometry, snaps: list[Snapshot]) -> dict[str, list[int]]:
    """Per step: tokens whose KV exists, token slots its blocks hold, pages it touches."""
    return {"kv tokens": [s.num_computed if s.table else 0 for s in snaps],
            "slots held": [len(s.table) * geo.block_size for s in snaps],
            "pages touched": [len(set(s.pages)) for s in snaps]}


def footprint_figure(geo: KVGeometry, snaps: list[Snapshot], at: int | None = None) -> go.Figure:
    data = footprint(geo, snaps)
    steps = [s.step for s in snaps]
    fig = go.Figure()
    for name in ("kv tokens", "slots held"):
        fig.add_trace(go.Scatter(x=steps, y=data[name], mode="lines+markers", name=name,
                                 line_shape="hv"))
    fig.add_trace(go.Scatter(x=steps, y=data["pages touched"], mode="lines+markers",
                             name="pages touched (right axis)", yaxis="y2", line_shape="hv",
                             line=dict(dash="dot")))
    fig.update_layout(
        title="Our request's footprint per step", font=FONT, height=300, plot_bgcolor=WHITE,
        margin=dict(l=60, r=60, t=60, b=40), xaxis=dict(title="step"),
        yaxis=dict(title="tokens / slots", rangemode="tozero"),
        yaxis2=dict(title="pages", overlaying="y", side="right", rangemode="tozero",
                    showgrid=False, dtick=1),
        legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
        shapes=[_cursor(at if at is not None else steps[-1])])
    return fig


def _cursor(step: int) -> dict:
    return dict(type="line", x0=step, x1=step, y0=0, y1=1, yref="paper",
                line=dict(color=PATH, width=2))


def walk_explorer(eng: SteppedEngine, *, view: str | None = None, width: int = 16,
                  live: bool | None = None):
    """Table, page map and footprint with a step slider (live), or the last step (static)."""
    snaps, geo = eng.snapshots, eng.kv.geometry
    view = view or (eng.kind if eng.kind in VIEWS else "vllm")
    live = is_live() if live is None else live
    last = len(snaps) - 1
    table = figure(table_figure(geo, snaps[last], view), live=live)
    pmap = figure(walk_page_map(eng.rec, snaps[last], width=width), live=live)
    foot = figure(footprint_figure(geo, snaps, last), live=live)
    if not live:
        from IPython.display import display

        for fig in (table, pmap, foot):
            display(fig)
        return None
    import ipywidgets as w

    slider = w.IntSlider(value=last, min=0, max=last, description="step",
                         continuous_update=False, layout=w.Layout(width="520px"))
    play = w.Play(value=last, min=0, max=last, interval=700, description="play")
    w.jslink((play, "value"), (slider, "value"))

    def redraw(_change=None) -> None:
        s = snaps[slider.value]
        new = table_figure(geo, s, view)
        with table.batch_update():
            table.data = []
            table.add_traces(list(new.data))
            table.layout = new.layout
        update_page_map(pmap, eng.rec, s.step, width=width)
        x, y = _ring_xy(s.pages, width)
        with pmap.batch_update():
            pmap.data[-1].x, pmap.data[-1].y = x, y
            pmap.layout.title.text = f"Page map after step {s.step} (ringed: our request's pages)"
        foot.layout.shapes = [_cursor(s.step)]

    slider.observe(redraw, names="value")
    box = w.VBox([w.HBox([play, slider]), table, pmap, foot])
    box.add_class("wb-walk")
    return box
