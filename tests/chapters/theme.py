"""The template of every figure an executed notebook shows (chapters and labs share the check)."""

from __future__ import annotations

from workbench.viz.style import SERIES_COLORS


def figure_colorways(nb) -> list[list[str] | None]:
    """The template colourway of every plotly figure in an executed notebook: live ones (a
    FigureWidget's saved widget state) and static ones (the plotly mime bundle)."""
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    layouts = [m.get("state", {}).get("_widget_layout") for m in state.get("state", {}).values()]
    layouts = [lay for lay in layouts if lay is not None]
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            fig = o.get("data", {}).get("application/vnd.plotly.v1+json")
            if fig:
                layouts.append(fig.get("layout", {}))
    return [(lay.get("template") or {}).get("layout", {}).get("colorway") for lay in layouts]


def assert_one_theme(nb, name: str) -> None:
    """Every figure of the notebook is drawn with the workbench theme (workbench/viz/style.py)."""
    ways = figure_colorways(nb)
    assert ways, f"{name} shows no figure"
    off = [w for w in ways if list(w or []) != SERIES_COLORS]
    assert not off, f"{name}: {len(off)} of {len(ways)} figures not in the workbench theme"
