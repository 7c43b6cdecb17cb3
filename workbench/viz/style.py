"""The one colour scheme of every figure (chapters and labs): a state looks the same everywhere.

Every colour a figure uses is named here, and :data:`THEME` (a plotly template registered as
``"workbench"`` and made the default when this module is imported) gives every figure the same
font, background, grid and series colours, also a lab's own figure that sets none.
``tests/chapters/test_theme.py`` fails on a colour literal anywhere else in ``workbench/viz`` and
on a figure of a chapter or lab drawn without this template.
"""

from __future__ import annotations

STATE_COLORS = {
    "free": "#e9ecef",  # zero page only: no physical memory
    "reserved": "#74c0fc",  # mapped, parked for reuse
    "in_use": "#2b8a3e",  # mapped, holds live blocks
    "retired": "#f59f00",  # empty, waiting for the release barrier
    "reclaimed": "#adb5bd",  # outside the current limit
    "quarantined": "#e03131",  # backing unknown: never issued again
}
# Pool and page-id colours share no hue with the state colours above: a green or amber cell
# must always mean a state, never "pool 3" or "page 7" (tests/chapters/test_ch00_04.py).
POOL_COLORS = ["#3b5bdb", "#9c36b5", "#0c8599", "#862e9c", "#8d5524", "#5f3dc4"]
# A figure's series in order: the pool colours with neighbours apart in hue (blue, teal, brown,
# purple, violet, plum), so a four-series bar chart never sets two purples side by side.
SERIES_COLORS = [POOL_COLORS[i] for i in (0, 2, 4, 1, 5, 3)]
PAGE_COLORS = ["#f783ac", "#ffe066", "#63e6be", "#e599f7", "#ffc078", "#da77f2"]
FONT = dict(family="Inter, Helvetica, Arial, sans-serif", size=12)

# Ink and paper: text, edges, guides and backgrounds.
WHITE = "#ffffff"
INK = "#212529"  # text, markers, guide lines
EDGE = "#495057"  # box outlines, secondary text
MUTED = "#868e96"  # an inactive arrow
RULE = "#adb5bd"  # lifelines, "cached, no owner"
GRID = "#e9ecef"
PANEL = "#f1f3f5"  # a participant's label box, a released state
TRANSLUCENT = "rgba(255,255,255,0.8)"  # a label over an arrow

# Meaning colours, reused wherever the meaning recurs.
OK = STATE_COLORS["in_use"]  # answered, held by requests
BAD = STATE_COLORS["quarantined"]  # no reply, an error
WARN = STATE_COLORS["retired"]  # cached with no owner, a variant range
LIMIT = "#c92a2a"  # a capacity or budget line
FOCUS = "#d9480f"  # the highlighted page, state or edge
PATH = "#e8590c"  # a request's walk through the table
NOTE = "#fff9db"  # a message's label
SHADE = "#ffe8cc"  # a loaded window behind a plot

# Light fills for regions (phases of a fault, states of a transaction, spans of a layout).
TINTS = {"blue": "#d0ebff", "yellow": "#fff3bf", "green": "#d3f9d8", "red": "#ffe3e3",
         "grey": "#dee2e6", "sky": "#a5d8ff", "violet": "#d0bfff"}
# Phase windows behind a timeline: the tints, seen through (a curve stays readable on them).
WINDOW_SHADES = ("rgba(208,235,255,0.55)", "rgba(255,243,191,0.55)", "rgba(211,249,216,0.55)",
                 "rgba(255,227,227,0.55)", "rgba(208,191,255,0.45)", "rgba(222,226,230,0.55)")
# Phases of a disaggregated request, queue to decode (colours of one hue family per stage).
HANDOVER_COLORS = {"prefill_queue": TINTS["grey"], "prefill": "#4dabf7", "link_queue": "#ffd43b",
                   "transfer": "#f76707", "decode_wait": "#e599f7", "tail": "#9775fa",
                   "decode": "#51cf66"}
# Distinct variant ranges in an operations grid (red first: a broken range).
VARIANT_COLORS = [LIMIT, "#4c6ef5", "#12b886", WARN, "#7950f2", MUTED]

THEME_NAME = "workbench"


def _theme():
    import plotly.graph_objects as go

    axis = dict(gridcolor=GRID, zerolinecolor=GRID, linecolor=RULE, ticks="outside",
                tickcolor=RULE, title=dict(standoff=8))
    return go.layout.Template(layout=dict(
        font=dict(FONT, color=INK), colorway=SERIES_COLORS, paper_bgcolor=WHITE,
        plot_bgcolor=WHITE, title=dict(font=dict(size=15, color=INK), x=0.02, xanchor="left"),
        xaxis=axis, yaxis=axis, legend=dict(bgcolor=TRANSLUCENT),
        hoverlabel=dict(font=dict(family=FONT["family"], size=11)),
        margin=dict(l=60, r=20, t=60, b=50)))


def use_theme() -> None:
    """Register :data:`THEME` and make it plotly's default (idempotent)."""
    import plotly.io as pio

    if THEME_NAME not in pio.templates:
        pio.templates[THEME_NAME] = _theme()
    if pio.templates.default != THEME_NAME:
        pio.templates.default = THEME_NAME


def themed(fig):
    """``fig`` drawn with the workbench template (a figure built before the default was set,
    or by code that named another template)."""
    import plotly.io as pio

    use_theme()
    fig.layout.template = pio.templates[THEME_NAME]
    return fig


def pool_color(i: int) -> str:
    return POOL_COLORS[i % len(POOL_COLORS)]


def page_color(i: int) -> str:
    """The fill of the i-th distinct VMM page id in a block-table figure."""
    return PAGE_COLORS[i % len(PAGE_COLORS)]


def discrete_scale(colors: list[str]) -> list[list]:
    """A heatmap colourscale where integer z = i gets exactly ``colors[i]``
    (use with zmin=-0.5, zmax=len(colors)-0.5)."""
    n = len(colors)
    scale: list[list] = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


try:  # plotly is optional for the core; every figure imports this module first
    use_theme()
except ImportError:
    pass
