"""``labs run NAME --html DIR`` writes one page that works offline: the report, every figure
titled and drawn, plotly.js inside the page. Chromium opens it with the network off and every
request that is not the file itself refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chapters.browser import chromium

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, lab: str) -> Path:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "workbench", "labs", "run", lab, "--quick",
                    "--html", str(tmp_path)], check=True, env=env, capture_output=True,
                   timeout=120)
    return tmp_path / "index.html"


@pytest.mark.browser
@pytest.mark.timeout(180)
def test_lab_page_draws_its_titled_figures_offline(tmp_path):
    page_path = _write(tmp_path, "02")
    with chromium() as b:
        ctx = b.new_context(offline=True, viewport={"width": 1200, "height": 900})
        asked: list[str] = []

        def refuse(route):
            if not route.request.url.startswith("file:"):
                asked.append(route.request.url)
                route.abort()
            else:
                route.continue_()

        ctx.route("**/*", refuse)
        page = ctx.new_page()
        page.goto(page_path.as_uri())
        sections = page.locator("section.wb-figure").count()
        assert sections >= 1
        page.wait_for_function(
            "n => document.querySelectorAll('.js-plotly-plot .main-svg').length >= n",
            arg=sections, timeout=60_000)
        titles = page.evaluate("() => [...document.querySelectorAll('section.wb-figure')]"
                               ".map(s => (s.querySelector('.gtitle') || {}).textContent || '')")
        assert len(titles) == sections and all(t.strip() for t in titles), titles
        assert page.locator("main table").count() >= 1  # the report's tables rendered
        assert page.locator("nav a").count() == sections
        assert asked == []
        shots = os.environ.get("WORKBENCH_SHOTS")  # screenshots for a write-up, if asked
        if shots:
            page.screenshot(path=str(Path(shots) / "lab02_index.png"), full_page=False)
            page.locator("section.wb-figure").first.screenshot(
                path=str(Path(shots) / "lab02_figure.png"))
        ctx.close()


def test_a_figure_without_a_title_is_titled_by_its_axes_else_its_name():
    import plotly.graph_objects as go

    from workbench.viz.labpage import figure_title

    fig = go.Figure(layout=dict(xaxis_title="PEAK (req/s)", yaxis_title="TTFT (ms)"))
    assert figure_title("ttft", fig) == "TTFT (ms) against PEAK (req/s)"
    assert figure_title("mapped_kv", go.Figure()) == "mapped kv"
    assert figure_title("x", go.Figure(layout=dict(title="Own"))) == "Own"
