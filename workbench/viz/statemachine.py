"""The VMM page state machine (seed 001 §8) with one chosen page highlighted.

Nodes are the places a page id can be; edges the transitions the core emits (their ``cause``
names). The prepare/commit/abort nodes are the two-phase unmap a coordinator runs across workers.
"""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.core.events import Event
from workbench.viz.style import (
    EDGE,
    FOCUS,
    FONT,
    INK,
    MUTED,
    PANEL,
    STATE_COLORS,
    TINTS,
    TRANSLUCENT,
    WHITE,
)

# node -> (x, y, label, fill)
NODES: dict[str, tuple[float, float, str, str]] = {
    "vrange": (0.0, 4.05, "virtual range<br>reserved", WHITE),
    "free": (0.0, 3.0, "FREE<br>zero page only", STATE_COLORS["free"]),
    "in_use": (0.0, 1.8, "IN_USE<br>physical page mapped", STATE_COLORS["in_use"]),
    "reserved": (2.6, 1.8, "RESERVED<br>mapped, no live block", STATE_COLORS["reserved"]),
    "retired": (-2.6, 0.6, "RETIRED<br>wait for release barrier", STATE_COLORS["retired"]),
    "prepared": (0.0, 0.6, "UNMAP PREPARED<br>handles retained", TINTS["yellow"]),
    "released": (-1.6, -0.6, "handle released<br>(back to FREE)", PANEL),
    "restored": (1.6, -0.6, "mapping restored<br>(abort)", TINTS["blue"]),
    "reclaimed": (-2.6, 3.0, "RECLAIMED<br>outside the limit", STATE_COLORS["reclaimed"]),
    "quarantined": (2.6, 3.0, "QUARANTINED<br>never issued again", STATE_COLORS["quarantined"]),
}
# (src, dst, label)
EDGES: list[tuple[str, str, str]] = [
    ("vrange", "free", "initialize"),
    ("free", "in_use", "map (alloc needs backing)"),
    ("free", "reserved", "prealloc"),
    ("in_use", "reserved", "park (reserve budget)"),
    ("reserved", "in_use", "reuse"),
    ("in_use", "retired", "retire (async)"),
    ("in_use", "prepared", "last block freed"),
    ("retired", "prepared", "barrier passed"),
    ("retired", "reserved", "barrier passed, parked"),
    ("reserved", "prepared", "trim / shrink"),
    ("prepared", "released", "commit"),
    ("prepared", "restored", "abort"),
    ("free", "reclaimed", "shrink"),
    ("in_use", "reclaimed", "shrink: unmap past limit"),
    ("retired", "reclaimed", "barrier, past limit"),
    ("reclaimed", "free", "grow"),
    ("free", "quarantined", "rollback failed"),
]


def node_of(state: str) -> str:
    return state if state in NODES else "free"


def edge_of(e: Event | None) -> tuple[str, str] | None:
    """The diagram edge a core event walked. An unmap back to FREE passes through "prepared"
    (the core prepares then commits in one step); a page in the retired tail of a limit that
    loses its last block goes straight to RECLAIMED (the shrink edges), not "last block freed"."""
    if e is None or e.src == e.dst:
        return None
    if e.dst == "reclaimed" and e.src in ("in_use", "retired"):
        return (e.src, "reclaimed")
    if e.dst in ("free", "reclaimed") and e.src in ("in_use", "reserved", "retired"):
        return (e.src, "prepared")
    return (e.src, e.dst)


def state_machine(state: str | None = None, last: Event | None = None,
                  title: str = "VMM page state machine") -> go.Figure:
    """The diagram; ``state`` highlights where the chosen page is, ``last`` its last move."""
    fig = go.Figure()
    _draw(fig, state, last, title)
    return fig


W, H = 0.62, 0.30  # half width and half height of a node box, in data units
# where along an edge its label sits (default: the middle), for edges whose middle is taken
LABEL_AT = {("retired", "reserved"): 0.78}


def _border(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float]:
    """Where the segment from box centre (x0, y0) towards (x1, y1) leaves the box."""
    dx, dy = x1 - x0, y1 - y0
    t = min(W / abs(dx) if dx else 1e9, H / abs(dy) if dy else 1e9)
    return x0 + dx * t, y0 + dy * t


def _draw(fig, state: str | None, last: Event | None, title: str) -> None:
    here = node_of(state) if state else None
    hot = edge_of(last)
    annotations, shapes = [], []
    for src, dst, label in EDGES:
        x0, y0, *_ = NODES[src]
        x1, y1, *_ = NODES[dst]
        on = hot == (src, dst)
        off = 0.0
        if (dst, src) in {(a, b) for a, b, _ in EDGES}:  # a two-way pair: draw side by side
            off = 0.08 if src < dst else -0.08
        vertical = abs(x1 - x0) < 1e-9
        ox, oy = (off, 0.0) if vertical else (0.0, off)
        sx, sy = _border(x0, y0, x1, y1)
        tx, ty = _border(x1, y1, x0, y0)
        annotations.append(dict(
            x=tx + ox, y=ty + oy, ax=sx + ox, ay=sy + oy, xref="x", yref="y", axref="x",
            ayref="y", text="", showarrow=True, arrowhead=2, arrowsize=1.1,
            arrowwidth=3.5 if on else 1.3, arrowcolor=FOCUS if on else MUTED))
        f = LABEL_AT.get((src, dst), 0.5)
        lx, ly = sx + (tx - sx) * f + ox * 2.5, sy + (ty - sy) * f + oy * 2.5
        annotations.append(dict(x=lx, y=ly, xref="x", yref="y", text=label, showarrow=False,
                                font=dict(size=10, color=FOCUS if on else EDGE),
                                bgcolor=TRANSLUCENT))
    for name, (x, y, text, fill) in NODES.items():
        me = name == here
        shapes.append(dict(type="rect", x0=x - W, x1=x + W, y0=y - H, y1=y + H, fillcolor=fill,
                           line=dict(color=FOCUS if me else EDGE, width=5 if me else 1),
                           layer="below"))
        annotations.append(dict(x=x, y=y, xref="x", yref="y", text=text, showarrow=False,
                                font=dict(size=11, color=INK)))
    # An invisible trace carries hover text and keeps the axes in place.
    names = list(NODES)
    fig.add_trace(go.Scatter(x=[NODES[n][0] for n in names], y=[NODES[n][1] for n in names],
                             mode="markers", marker=dict(size=40, opacity=0),
                             hovertext=[NODES[n][2].replace("<br>", " ") for n in names],
                             hoverinfo="text", showlegend=False, name="states"))
    sub = f" — chosen page is {state.upper()}" if state else ""
    if last is not None and last.src != last.dst:
        sub += f" (last: {last.src}→{last.dst}, {last.cause})"
    fig.update_layout(title=dict(text=title + sub, font=dict(size=14)), font=FONT, height=560,
                      annotations=annotations, shapes=shapes,
                      margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor=WHITE,
                      xaxis=dict(visible=False, range=[-3.4, 3.4]),
                      yaxis=dict(visible=False, range=[-1.0, 4.4]))


def update_state_machine(fig, state: str | None, last: Event | None,
                         title: str = "VMM page state machine") -> None:
    with fig.batch_update():
        fig.data = []
        _draw(fig, state, last, title)
