"""One colour scheme for every figure of every chapter and lab, set in workbench/viz/style.py:
no colour literal elsewhere in the figure code, and the theme on every figure drawn (the
notebooks' own runs check it on each figure they show: tests/chapters/theme.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

go = pytest.importorskip("plotly.graph_objects")

from workbench.viz import figure  # noqa: E402
from workbench.viz.labfigs import styled  # noqa: E402
from workbench.viz.style import SERIES_COLORS, THEME_NAME  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# figure code: every viz module but the palette itself, and the labs' shared figure kit
FIGURE_CODE = [p for p in (ROOT / "workbench" / "viz").glob("*.py") if p.name != "style.py"] \
    + [ROOT / "workbench" / "labs" / "kit" / "phase_figs.py"]
LITERAL = re.compile(r"""#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b|rgba?\(|color\s*=\s*["'][a-z]+["']""")


@pytest.mark.parametrize("path", FIGURE_CODE, ids=lambda p: p.name)
def test_figure_code_names_its_colours_from_the_palette(path):
    hits = [f"{path.name}:{n}: {line.strip()}"
            for n, line in enumerate(path.read_text().splitlines(), 1) if LITERAL.search(line)]
    assert hits == [], "colour literals outside workbench/viz/style.py:\n" + "\n".join(hits)


def test_the_theme_is_plotlys_default_once_workbench_viz_is_imported():
    import plotly.io as pio

    assert pio.templates.default == THEME_NAME
    fig = go.Figure(go.Bar(x=[1], y=[1]))
    assert list(fig.layout.template.layout.colorway) == SERIES_COLORS
    assert fig.layout.template.layout.plot_bgcolor == "#ffffff"


@pytest.mark.parametrize("live", [True, False])
def test_a_figure_built_with_another_template_is_shown_in_ours(live):
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 0]), layout=dict(template="plotly_dark"))
    shown = figure(fig, live=live)
    assert list(shown.layout.template.layout.colorway) == SERIES_COLORS


def test_a_lab_figure_is_styled_in_the_theme():
    fig = styled(go.Figure(go.Bar(x=[1], y=[2]), layout=dict(template="ggplot2")), "t")
    assert list(fig.layout.template.layout.colorway) == SERIES_COLORS
    assert fig.layout.title.text == "t"
