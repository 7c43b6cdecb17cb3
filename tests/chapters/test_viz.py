"""The plots read the event trace faithfully, and the live widgets react to their controls."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly", reason="the notebook stack is not installed (make setup)")
import plotly.graph_objects as go  # noqa: E402
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.core.geometry import KVGeometry
from workbench.errors import ConfigError
from workbench.viz import (
    Explorer,
    Message,
    Recording,
    block_table_figure,
    bytes_figure,
    figure,
    page_map,
    request_spans,
    sequence_figure,
    set_live,
    state_machine,
)
from workbench.viz.controls import sliders
from workbench.viz.scenarios import churn, colocation, one_request, prefix_sharing, tp_transaction
from workbench.viz.statemachine import EDGES, NODES, edge_of
from workbench.viz.trace import STATES


@pytest.fixture(autouse=True)
def _auto_live():
    set_live(None)
    yield
    set_live(None)


def _check_against_pools(rec: Recording) -> None:
    """The fold of the events equals the allocators' own state."""
    states = rec.states_at(None)
    for name, kv in rec.managers.items():
        assert states[name] == [s.value for s in kv.pages.state]
        assert rec.series()[name]["mapped"][-1] == kv.mapped_bytes


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 10), st.integers(0, 30), st.integers(2, 24), st.booleans(),
       st.integers(0, 3))
def test_churn_trace_matches_pool(load, limit_at, limit_pages, defer, seed):
    res = churn(steps=30, load=load, limit_pages=limit_pages, limit_at=limit_at, seed=seed,
                defer_release=defer)
    _check_against_pools(res.rec)
    res.rec.managers["pool"].check_invariants()
    # every step's snapshot of mapped bytes never exceeds the pool's capacity
    s = res.rec.series()["pool"]
    assert max(s["mapped"]) <= res.rec.managers["pool"].capacity_bytes
    assert all(r <= m for r, m in zip(s["reserved"], s["mapped"], strict=True))


def test_colocation_trace_matches_pools_and_device():
    res = colocation(steps=30, limit_pool="a", limit_gib=0.25, limit_at=5)
    _check_against_pools(res.rec)
    dev = res.rec.managers["a"].device
    total = sum(kv.mapped_bytes for kv in res.rec.managers.values())
    assert total <= dev.capacity


def test_prefix_sharing_trace_and_ownership():
    res = prefix_sharing(steps=12, max_cached_tokens=512)
    _check_against_pools(res.rec)
    assert len(res.ownership) == len(res.rec.steps) == len(res.mapped_live_bytes)
    g = res.pool.geometry
    for own in res.ownership:
        assert [sum(o) for o in own] == [g.blocks_per_page(p) for p in range(g.num_pages)]
    # a page with any held or cached block is mapped at the end
    states = res.rec.states_at(None)["pool"]
    for p, (held, cached, _free) in enumerate(res.ownership[-1]):
        if held or cached:
            assert states[p] == "in_use"


def test_states_at_each_step_are_prefix_folds():
    res = churn(steps=10, load=4)
    rec = res.rec
    for i, step in enumerate(rec.steps):
        st_i = rec.states_at(i)["pool"]
        expect = ["free"] * rec.pools["pool"].num_pages
        for e in rec.events[:step.end]:
            if e.page >= 0 and e.dst in STATES:
                expect[e.page] = e.dst
        assert st_i == expect


def test_page_map_cells_and_colours():
    res = colocation(steps=12)
    rec = res.rec
    fig = page_map(rec, 6, width=32, color_by="owner")
    z = fig.data[0].z
    cells = [v for row in z for v in row if v is not None]
    assert len(cells) == sum(p.num_pages for p in rec.pools.values())
    states = rec.states_at(6)
    mapped = sum(s in ("in_use", "reserved", "retired") for v in states.values() for s in v)
    assert sum(1 for v in cells if v > 0) == mapped
    fig2 = page_map(rec, 6, color_by="state")
    assert {t.name for t in fig2.data[1:]} == set(STATES)


def test_state_machine_highlight():
    assert set(NODES) >= set(STATES) - {"free"} | {"free"}
    for src, dst, _ in EDGES:
        assert src in NODES and dst in NODES
    res = churn(steps=20, load=6)
    rec = res.rec
    page = next(e.page for e in rec.events if e.page > 0 and e.dst == "in_use")
    last = rec.last_event("pool", page)
    fig = state_machine(rec.states_at(None)["pool"][page], last)
    widths = [s.line.width for s in fig.layout.shapes]
    assert widths.count(5) == 1  # exactly one node highlighted
    hot = edge_of(last)
    if hot:
        assert any(a.arrowwidth == 3.5 for a in fig.layout.annotations)


def test_bytes_figure_series():
    res = colocation(steps=10)
    fig = bytes_figure(res.rec, 3, capacity=1 << 30)
    # no limit set: mapped and reserved per pool, no "limit" line (an unset limit is the
    # capacity, which must not be drawn or named as a limit)
    assert [t.name for t in fig.data] == [f"{n} {k}" for n in "abc" for k in ("mapped", "reserved")]
    assert len(fig.data[0].x) == len(res.rec.steps)
    assert [a.text for a in fig.layout.annotations] == ["device capacity"]
    capped = colocation(steps=10, limit_pool="a", limit_gib=0.25, limit_at=4)
    fig = bytes_figure(capped.rec, 3)
    assert [t.name for t in fig.data if t.name.endswith("limit")] == ["a limit"]
    line = next(t for t in fig.data if t.name == "a limit").y
    assert line[:4] == (None,) * 4 and set(line[4:]) == {0.25}


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 700), st.sampled_from([8, 16, 32]), st.sampled_from(["vllm", "sglang"]))
def test_block_table_spans_cover_every_token(num_tokens, bs, view):
    kv, ids, _ = one_request(num_tokens, block_size=bs)
    spans = request_spans(kv.geometry, ids, num_tokens, view)
    for lane in (0, 1, 2):
        lane_spans = sorted((s.start, s.stop) for s in spans if s.lane == lane)
        assert lane_spans[0][0] == 0 and lane_spans[-1][1] == num_tokens
        assert all(a[1] == b[0] for a, b in zip(lane_spans, lane_spans[1:], strict=False))
    pages = [s.label for s in spans if s.lane == 2]
    assert pages == [f"p{kv.geometry.block_page(b)}" for b in ids]


def test_block_table_rejects_short_tables():
    g = KVGeometry(num_layers=2, kv_heads=2, head_dim=64, block_size=16, num_blocks=64)
    with pytest.raises(ConfigError, match="need 2 blocks"):
        request_spans(g, [1], 20)
    fig = block_table_figure(g, [5, 9], 20)
    assert len(fig.data) == 2


def test_sequence_figure_from_a_real_transaction():
    tx = tp_transaction(tp=2)
    ops = [m.label.split()[0] for m in tx.messages if m.src == "coordinator"]
    assert ops == ["MAP", "MAP", "PREPARE", "PREPARE", "COMMIT", "COMMIT"]
    fig = sequence_figure(tx.messages, tx.participants)
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    assert len(arrows) == len(tx.messages)
    lost = tp_transaction(tp=2, fault="drop_reply")
    assert any(not m.ok for m in lost.messages)
    assert [m.label.split()[0] for m in lost.messages if m.src == "coordinator"][-1] == "ABORT"
    assert "reserved" in lost.outcome  # aborted: the page stays mapped and is parked


def test_sequence_accepts_dicts_tuples_and_notes():
    fig = sequence_figure([{"src": "a", "dst": "b", "label": "x"}, ("b", "a", "y", 1e-6, False),
                           Message("a", "a", "note")])
    assert len([a for a in fig.layout.annotations if a.showarrow]) == 2


def test_explorer_live_controls_drive_the_figures():
    ctl = sliders(live=True, steps=20, load=(4, 1, 12), limit_pages=(10, 2, 24), limit_at=10)
    ex = Explorer(churn, ctl, live=True)
    assert isinstance(ex.fig_map, go.FigureWidget)
    last = [list(r) for r in ex.fig_map.data[0].z]
    ex.step_slider.value = 2  # what dragging the slider does
    assert ex.step == 2 and [list(r) for r in ex.fig_map.data[0].z] != last
    assert ex.label.value.startswith("<b>step 2:")  # the slider's value is the label's step
    ex.page_slider.value = 3
    assert "page 3" in ex.fig_machine.layout.title.text
    n_events = len(ex.rec.events)
    ctl["load"].value = 12  # re-runs the scenario
    assert len(ex.rec.events) != n_events and ex.step == len(ex.rec.steps) - 1
    from types import SimpleNamespace

    row, col = 1, 2  # a click on the second row of the page map (pages 24..) picks page 26
    ex._clicked(ex.fig_map.data[0], SimpleNamespace(xs=[col], ys=[row]), None)
    assert ex.page == 26 and "page 26" in ex.fig_machine.layout.title.text
    ex.color_tb.value = "owner"
    assert {t.name for t in ex.fig_map.data[1:]} == {"unmapped", "pool"}


def test_static_mode_gives_plain_figures(monkeypatch):
    import plotly.io as pio

    monkeypatch.setattr(pio.renderers, "default", pio.renderers.default)  # restored afterwards
    monkeypatch.setenv("WORKBENCH_VIZ", "static")
    ctl = sliders(steps=10, load=(4, 1, 12))
    assert ctl == {"steps": 10, "load": 4}
    ex = Explorer(churn, ctl)
    assert not ex.live
    figs = ex.figures()
    assert all(type(f) is go.Figure for f in figs.values())
    assert type(figure(go.FigureWidget())) is go.Figure
    assert "notebook" in pio.renderers.default


def test_make_device_backends():
    from workbench.backends import make_device
    from workbench.errors import ConfigError

    assert make_device("sim").name.startswith("sim-")
    with pytest.raises(ConfigError):
        make_device("tpu")
