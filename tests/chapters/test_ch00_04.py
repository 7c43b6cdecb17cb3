"""Chapters 00-04 made precise (issue 14, item 3): what each fix promises, held by a test."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("plotly", reason="the notebook stack is not installed (make setup)")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from workbench.core.events import Event  # noqa: E402
from workbench.core.geometry import KVGeometry  # noqa: E402
from workbench.viz import Explorer, bytes_figure, set_live, state_machine  # noqa: E402
from workbench.viz.blocktable import CHAR_PX, PLOT_PX, request_spans, visible_labels  # noqa: E402
from workbench.viz.layouts import layout_costs  # noqa: E402
from workbench.viz.scenarios import (  # noqa: E402
    churn,
    colocation,
    one_request,
    prefix_sharing,
    request_stream,
)
from workbench.viz.statemachine import EDGES, edge_of  # noqa: E402
from workbench.viz.style import PAGE_COLORS, POOL_COLORS, STATE_COLORS  # noqa: E402
from workbench.viz.trace import STATES  # noqa: E402

from .nbrun import CHAPTERS, ROOT  # noqa: E402


@pytest.fixture(autouse=True)
def _auto_live():
    set_live(None)
    yield
    set_live(None)


def _text(stem: str) -> str:
    nb = json.loads((CHAPTERS / f"{stem}.ipynb").read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"])


# -- the step slider and its label agree ------------------------------------------------------
RUNS = {
    "churn": lambda: churn(steps=12, load=5, limit_pages=6, limit_at=5).rec,
    "churn limit at 0": lambda: churn(steps=6, limit_pages=6, limit_at=0).rec,
    "colocation": lambda: colocation(steps=10, limit_pool="a", limit_gib=0.25, limit_at=3).rec,
    "prefix_sharing": lambda: prefix_sharing(steps=8, reset_at=4).rec,
    "one_request": lambda: one_request(300)[2],
}


@pytest.mark.parametrize("name", RUNS)
def test_every_step_label_names_its_own_index(name):
    labels = RUNS[name]().labels()
    assert [int(re.match(r"step (\d+): ", s).group(1)) for s in labels] == list(range(len(labels)))


def test_slider_value_and_label_agree_at_every_step():
    ex = Explorer(lambda: churn(steps=10, load=4, limit_pages=6, limit_at=4), live=True)
    for k in range(len(ex.rec.steps)):
        ex.step_slider.value = k
        assert ex.label.value.startswith(f"<b>step {k}:")
        assert ex.fig_map.layout.title.text.startswith(f"Page map — step {k}:")
    assert "limit 6 pages" in ex.rec.steps[4].label  # limit_at=4 acts in step 4


# -- the shrink edge --------------------------------------------------------------------------
def test_shrink_of_an_in_use_page_lights_the_shrink_edge():
    res = churn(steps=30, load=8, limit_pages=4, limit_at=6)
    shrunk = [e for e in res.rec.events if e.src == "in_use" and e.dst == "reclaimed"]
    assert shrunk and all(e.cause == "shrink" for e in shrunk)
    e = shrunk[0]
    assert edge_of(e) == ("in_use", "reclaimed")
    fig = state_machine("reclaimed", e)
    hot = [a.text for a in fig.layout.annotations if a.font and a.font.color == "#d9480f"]
    assert hot == ["shrink: unmap past limit"]
    plain = Event(0.0, "pool", 3, "in_use", "free", "unmap")  # an ordinary last-block unmap
    assert edge_of(plain) == ("in_use", "prepared")
    assert dict(((s, d), lbl) for s, d, lbl in EDGES)[edge_of(plain)] == "last block freed"


@settings(max_examples=12, deadline=None)
@given(st.integers(2, 10), st.integers(0, 20), st.integers(1, 12), st.booleans())
def test_every_transition_the_core_emits_has_an_edge(load, limit_at, limit_pages, defer):
    res = churn(steps=24, load=load, limit_pages=limit_pages, limit_at=limit_at,
                defer_release=defer)
    edges = {(s, d) for s, d, _ in EDGES}
    for e in res.rec.events:
        if e.page < 0 or e.src not in STATES or e.dst not in STATES:
            continue  # pool-level events (limits) and notes walk no page edge
        hot = edge_of(e)
        assert hot is None or hot in edges, (e.src, e.dst, e.cause)


# -- colours ----------------------------------------------------------------------------------
def _rgb(h: str) -> tuple[int, ...]:
    return tuple(int(h[i:i + 2], 16) for i in (1, 3, 5))


def test_page_and_pool_colours_are_disjoint_from_state_colours():
    states, pools, pages = set(STATE_COLORS.values()), set(POOL_COLORS), set(PAGE_COLORS)
    assert not states & pools and not states & pages and not pools & pages
    # not merely different strings: no page or pool colour is near a state colour
    dist = min(sum((a - b) ** 2 for a, b in zip(_rgb(x), _rgb(y), strict=True)) ** 0.5
               for x in pools | pages for y in states)
    assert dist >= 70


def test_block_table_pages_use_the_page_palette():
    kv, ids, _ = one_request(300)
    page_fills = {s.color for s in request_spans(kv.geometry, ids, 300) if s.lane == 2}
    assert page_fills and page_fills <= set(PAGE_COLORS)


# -- the limit line ---------------------------------------------------------------------------
def test_no_limit_line_without_a_limit_and_one_from_the_step_it_is_set():
    free = churn(steps=8)
    assert set(free.rec.series()["pool"]["limit"]) == {0}
    assert not [t for t in bytes_figure(free.rec).data if "limit" in t.name]
    capped = churn(steps=8, limit_pages=10, limit_at=3)
    line = next(t for t in bytes_figure(capped.rec).data if t.name == "pool limit").y
    page_gib = capped.rec.pools["pool"].page_id_bytes / 2**30
    assert line[:3] == (None,) * 3 and set(line[3:]) == {10 * page_gib}


# -- a controlled comparison in 04 -------------------------------------------------------------
def test_capping_pool_a_leaves_b_and_c_streams_identical():
    free = colocation(steps=40, device_gib=1.0)
    capped = colocation(steps=40, device_gib=1.0, limit_pool="a", limit_gib=0.25, limit_at=8)
    assert capped.misses["a"] > free.misses["a"]  # the cap did change pool a's run
    for n in "abc":
        for res in (free, capped):  # each pool is offered its own stream, in order
            stream = request_stream(0, n)
            want = [(r.rid, r.target, first) for r, first in
                    (next(stream) for _ in res.offered[n])]
            assert res.offered[n] == want
    for n in "bc":
        k = min(len(free.offered[n]), len(capped.offered[n]))
        assert k >= 10 and free.offered[n][:k] == capped.offered[n][:k]
    assert request_stream(0, "b") is not request_stream(0, "c")
    assert next(request_stream(0, "b"))[0].target != next(request_stream(0, "c"))[0].target


# -- 01: the layout's cost in simulated time ----------------------------------------------------
def test_per_layer_layout_costs_one_call_per_range():
    g = KVGeometry(num_layers=32, kv_heads=8, head_dim=128, block_size=16, num_blocks=4096)
    contiguous, per_layer = layout_costs(g, pages=3)
    assert (contiguous.layout, contiguous.maps_per_page) == ("contiguous", 1)
    assert (per_layer.layout, per_layer.maps_per_page) == ("per_layer", 64)
    assert per_layer.map_s == pytest.approx(64 * contiguous.map_s)
    assert per_layer.unmap_s == pytest.approx(64 * contiguous.unmap_s)


# -- 01: exercise 2 can be solved, and this is its solution ------------------------------------
def _pages(num_tokens: int, bs: int) -> set[int]:
    kv, ids, _ = one_request(num_tokens, block_size=bs)
    return {kv.geometry.block_page(b) for b in ids}


def test_exercise_2_solution():
    kv, _, _ = one_request(1)
    assert kv.geometry.page_size // kv.geometry.token_bytes == 256  # tokens per page, any bs
    assert all(len(_pages(300, bs)) > 1 for bs in (8, 16, 32, 64))  # 300 > 256: impossible
    single = [n for n in range(1, 400) if len(_pages(n, 32)) == 1]
    per_page = kv.geometry.page_size // (kv.geometry.token_bytes * 32)
    # the largest: every block of page 0 but the null block (block 0)
    assert max(single) == (per_page - 1) * 32 == 224
    assert _pages(224, 32) == {0}


# -- 01: legible req_to_token labels -----------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 800), st.sampled_from([8, 16, 32, 64]), st.sampled_from(["vllm", "sglang"]))
def test_shown_labels_never_overlap(num_tokens, bs, view):
    kv, ids, _ = one_request(num_tokens, block_size=bs)
    spans = request_spans(kv.geometry, ids, num_tokens, view)
    px = PLOT_PX / num_tokens
    for lane in (0, 1, 2):
        lane_spans = [s for s in spans if s.lane == lane]
        shown = visible_labels(lane_spans, num_tokens)
        assert shown[0] == lane_spans[0].label  # the first box always says what the lane is
        boxes = [((s.start + s.stop) / 2 * px, len(lbl) * CHAR_PX / 2)
                 for s, lbl in zip(lane_spans, shown, strict=True) if lbl]
        assert all(c1 - h1 >= c0 + h0 for (c0, h0), (c1, h1) in zip(boxes, boxes[1:], strict=False))


def test_sglang_boxes_name_their_first_slot_and_hover_the_run():
    g = KVGeometry(num_layers=2, kv_heads=2, head_dim=64, block_size=16, num_blocks=64)
    spans = [s for s in request_spans(g, [5, 9], 20, "sglang") if s.lane == 1]
    assert [s.label for s in spans] == ["80…", "144…"]
    assert [s.hover for s in spans] == ["req_to_token[0:16] = slots 80–95",
                                        "req_to_token[16:20] = slots 144–147"]


# -- statements and the map --------------------------------------------------------------------
def test_corrected_statements():
    ch01, ch02 = _text("01_block_token_page"), _text("02_elastic_memory")
    assert "(not used)" not in ch01 and "page_size_bytes" in ch01
    assert "own copy of the KV range" not in ch02 and "shard" in ch02
    assert "null_block" in ch02 and "page 0 stays mapped" in ch02


def test_chapter_00_maps_every_chapter_and_lab():
    text = _text("00_start_here")
    chapters = sorted(p.name for p in CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    assert len(chapters) == 12
    for name in chapters:
        assert f"]({name})" in text, name
    links = set(re.findall(r"\]\(\.\./labs/([^)]+)\)", text))
    labs = {p.name for p in (ROOT / "labs").glob("[0-9][0-9]_*.ipynb")}
    assert labs <= links  # every lab notebook there is is linked
    assert all(re.fullmatch(r"\d\d_[a-z_]+\.ipynb|README\.md", x) for x in links)
    # each section cell is a link to its entry in docs/sources.md; read the links' labels
    plain = re.sub(r"\[(§\d+)\]\(\.\./docs/sources\.md#seed-00[01]-s\d+\)", r"\1", text)
    for section in ["§0", "§1–§2", "§3", "§4", "§5", "§6", "§7", "§8", "§9", "§10", "§11",
                    "§12", "§13"]:
        assert f"| {section} |" in plain, section
    for k in range(1, 9):
        assert f"experiment {k} |" in text
    assert text.count("\n| Why") + text.count("\n| Do ") + text.count("\n| What does the") \
        + text.count("\n| How does") == 10  # the ten self-test questions, each with its chapter


def test_chapter_01_page_map_follows_the_steps():
    """01's page map is an explorer over one_request's recording: each step shows that step."""
    ex = Explorer(lambda: one_request(300)[2], live=True, width=24)
    assert len(ex.rec.steps) == 5
    maps = []
    for k in range(5):
        ex.step_slider.value = k
        maps.append([list(r) for r in ex.fig_map.data[0].z])
    in_use = 2.0  # the state index of "in_use" in the page map's codes
    assert STATES[int(in_use)] == "in_use"
    assert [sum(v == in_use for row in m for v in row if v is not None) for m in maps] \
        == [sum(s == "in_use" for s in ex.rec.states_at(k)["pool"]) for k in range(5)]
    assert maps[0] != maps[4]  # our request puts blocks on page 1, parked until then
    assert "explore(lambda: one_request(" in _text("01_block_token_page")
