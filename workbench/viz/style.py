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
POOL_COLORS = ["#1971c2", "#e8590c", "#2f9e44", "#9c36b5", "#c2255c", "#0c8599", "#f08c00"]
FONT = dict(family="Inter, Helvetica, Arial, sans-serif", size=12)


def pool_color(i: int) -> str:
    return POOL_COLORS[i % len(POOL_COLORS)]


def discrete_scale(colors: list[str]) -> list[list]:
    """A heatmap colourscale where integer z = i gets exactly ``colors[i]``
    (use with zmin=-0.5, zmax=len(colors)-0.5)."""
    n = len(colors)
    scale: list[list] = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale
