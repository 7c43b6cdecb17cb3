"""The lab notebooks' figure helpers: every figure shown gets a title, tables render short and
escaped, and the re-run panel runs the lab with its controls' values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

go = pytest.importorskip("plotly.graph_objects")

from workbench.viz import labfigs  # noqa: E402
from workbench.viz.live import set_live  # noqa: E402


def _result(verdict="supported"):
    untitled = go.Figure(go.Bar(x=[1], y=[2]))
    own = go.Figure(go.Bar(x=[1], y=[2]), layout=dict(title="own title"))
    return SimpleNamespace(figures={"mapped_kv": untitled, "own": own},
                           record=SimpleNamespace(verdict=verdict), tables={})


@pytest.fixture
def static():
    set_live(False)
    yield
    set_live(None)


def test_every_shown_figure_has_a_title(static):
    shown = labfigs.show_figures(_result(), {"own": "given title"})
    assert [f.layout.title.text for f in shown] == ["mapped kv", "given title"]
    only = labfigs.show_figures(_result(), only=["own"])
    assert [f.layout.title.text for f in only] == ["own title"]


def test_table_is_short_escaped_and_inlines_nested_values():
    rows = [{"a": i, "b": {"p50": 1.23456, "p99": 4567.8}, "c": "<x>"} for i in range(15)]
    out = labfigs.table_html(rows, title="T", limit=12)
    assert out.count("<tr>") == 13 and "3 more rows" in out
    assert "p50: 1.23, p99: 4,568" in out and "&lt;x&gt;" in out and "<x>" not in out


def test_rerun_panel_passes_the_controls_values(static):
    seen = []

    def run(**kw):
        seen.append(kw)
        return _result()

    panel = labfigs.RerunPanel(run, tp=(2, 2, 8), kind=["vllm", "sglang"], quick=True)
    panel.rerun()
    assert seen == [{"tp": 2, "kind": "vllm", "quick": True}] and panel.box is None


def test_live_rerun_panel_builds_sliders_and_dropdowns():
    pytest.importorskip("ipywidgets")
    set_live(True)
    try:
        panel = labfigs.RerunPanel(lambda **kw: _result(str(kw)), tp=(2, 2, 8),
                                   kind=["vllm", "sglang"])
        panel.controls["tp"].value = 4
        panel.controls["kind"].value = "sglang"
        assert panel.values() == {"tp": 4, "kind": "sglang"}
        panel.rerun()
        assert "sglang" in panel.status.value and "wb-lab-rerun" in panel.box._dom_classes
    finally:
        set_live(None)
