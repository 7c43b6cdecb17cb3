"""Live or static: one switch for every figure.

Live (a kernel with a front end): plotly ``FigureWidget`` (anywidget) plus ipywidgets controls.
Static (``WORKBENCH_VIZ=static``, or no IPython kernel): plain ``go.Figure`` rendered with the
``notebook`` renderer too, so ``jupyter nbconvert --to html`` shows it without a widget state.
"""

from __future__ import annotations

import os

_forced: bool | None = None
STATIC_RENDERER = "plotly_mimetype+notebook"


def set_live(flag: bool | None) -> None:
    """Force live (True) or static (False) figures; None goes back to auto-detection."""
    global _forced
    _forced = flag
    if flag is False:
        use_static_renderer()


def is_live() -> bool:
    if _forced is not None:
        return _forced
    if os.environ.get("WORKBENCH_VIZ", "").lower() == "static":
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def use_static_renderer() -> None:
    """Emit both the plotly mime bundle (JupyterLab) and self-contained HTML (nbconvert)."""
    import plotly.io as pio

    if pio.renderers.default != STATIC_RENDERER:  # setting it injects plotly.js (~4.6 MB) again
        pio.renderers.default = STATIC_RENDERER


def figure(fig, live: bool | None = None):
    """``fig`` as a FigureWidget when live, else as a plain Figure; drawn with the workbench
    theme either way (:mod:`workbench.viz.style`)."""
    import plotly.graph_objects as go

    from workbench.viz.style import themed

    themed(fig)

    if live if live is not None else is_live():
        return fig if isinstance(fig, go.FigureWidget) else go.FigureWidget(fig)
    if not is_live():
        use_static_renderer()
    return go.Figure(fig) if isinstance(fig, go.FigureWidget) else fig
