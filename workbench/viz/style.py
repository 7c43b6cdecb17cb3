"""Colours shared by every figure, so a state looks the same everywhere."""

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
PAGE_COLORS = ["#f783ac", "#ffe066", "#63e6be", "#e599f7", "#ffc078", "#da77f2"]
FONT = dict(family="Inter, Helvetica, Arial, sans-serif", size=12)


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
