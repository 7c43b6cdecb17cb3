"""Chapter 05's package code: the stepped engines, the walk figures, the ownership runs."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.backends import make_device
from workbench.core.events import PageState
from workbench.errors import ConfigError
from workbench.viz.lifecycle import (
    WALK_GEOMETRY,
    build_engine,
    describe_step,
    prompt_tokens,
    walk_table,
)
from workbench.viz.processes import engine_core_split, sglang_ranks
from workbench.viz.walk import footprint, table_figure, walk_explorer, walk_page_map


def walk(kind: str, device=None, *, prompt_len: int = 160, new_tokens: int = 24,
         budget: int = 64, neighbour_at: int | None = 3, **kw):
    """The chapter's loop: our request, a neighbour sharing 96 tokens, then a cache reset."""
    eng = build_engine(kind, device or make_device("sim"), budget=budget, **kw)
    prompt = prompt_tokens(prompt_len)
    ours = eng.submit(prompt, new_tokens)
    eng.mark(ours, "submitted")
    neighbour, plans = None, []
    while eng.has_work():
        before = list(ours.blocks)
        plan = eng.step()
        plans.append((plan.kind, next((n for r, n in plan.items if r is ours), 0),
                      plan.num_seqs))
        if neighbour_at is not None and neighbour is None and len(eng.snapshots) > neighbour_at:
            neighbour = eng.submit(prompt[:96] + prompt_tokens(40, salt=1), 8)
        eng.mark(ours, describe_step(plan, ours, before))
    evicted = eng.drop_cache()
    eng.mark(ours, f"reset: {evicted}")
    return eng, ours, neighbour, plans, evicted


def test_vllm_walk_chunks_decodes_and_releases():
    eng, ours, nb, plans, evicted = walk("vllm")
    snaps = eng.snapshots
    assert [s.table for s in snaps[1:4]] == [[1, 2, 3, 4], list(range(1, 9)), list(range(1, 11))]
    assert [s.num_computed for s in snaps[1:4]] == [64, 128, 160]
    assert [p[1] for p in plans[:4]] == [64, 64, 32, 1]  # chunked prefill, then decode
    assert ours.first_token == pytest.approx(0.03)  # sampled in step 3
    assert plans[4] == ("mixed", 1, 2)  # our decode and the neighbour's prefill in one step
    assert nb.prefix_hit_tokens == 96 and ours.output_len == 24
    assert snaps[-2].state == "finished" and snaps[-2].table == []
    assert evicted == 13  # 11 full blocks of ours + 2 of the neighbour's were cached
    kv = eng.kv
    assert kv.used_blocks == 0
    assert kv.pages.state[0] is PageState.IN_USE  # the null block's page
    assert kv.pages.state[1] is PageState.RESERVED  # parked by the reset (reserve of 1)
    eng.cache.check_invariants()
    kv.check_invariants()


def test_sglang_walk_waits_while_the_neighbour_extends():
    eng, ours, nb, plans, _ = walk("sglang")
    assert [p[0] for p in plans[:4]] == ["extend"] * 3 + ["decode"]
    assert plans[4] == ("extend", 0, 1)  # the neighbour's extend runs alone; ours waits
    assert "ours: waits" in eng.snapshots[5].label
    assert nb.prefix_hit_tokens == 96  # matched while our request was still decoding
    assert eng.kv.used_blocks == 0 and eng.chain()[:2] == ["SGLangScheduler", "RadixCache"]
    eng.cache.check_invariants()


@settings(max_examples=20, deadline=None)
@given(kind=st.sampled_from(["vllm", "sglang"]), prompt_len=st.integers(1, 300),
       new_tokens=st.integers(1, 30), budget=st.integers(8, 128), caching=st.booleans())
def test_walk_table_matches_the_tokens_and_the_page_map(kind, prompt_len, new_tokens, budget,
                                                       caching):
    """Every step: the table covers exactly the tokens with KV, each block's page is in use in
    the recording, and after the reset the pool holds nothing but the null block."""
    eng, ours, _, _, _ = walk(kind, prompt_len=prompt_len, new_tokens=new_tokens, budget=budget,
                              neighbour_at=None, prefix_caching=caching)
    g = eng.kv.geometry
    for s in eng.snapshots:
        if s.state == "running":
            assert len(s.table) == -(-s.num_computed // g.block_size)
        assert s.pages == [g.block_page(b) for b in s.table]
        states = eng.rec.states_at(s.step)["pool"]
        assert all(states[p] == "in_use" for p in s.pages)
    assert ours.output_len == new_tokens
    assert eng.kv.used_blocks == 0
    assert eng.rec.states_at(None)["pool"] == [s.value for s in eng.kv.pages.state]


def test_build_engine_refuses_an_unknown_kind():
    with pytest.raises(ConfigError, match="use one of vllm, sglang"):
        build_engine("trt", make_device("sim"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="host memory needs memfd")
def test_mini_engine_makes_the_simulators_decisions():
    """backend='host': a real model over host VMM pages; the same scheduler, the same tables."""
    pytest.importorskip("torch")
    sim, *_ = walk("vllm", new_tokens=12)
    real, ours, nb, _, _ = walk("vllm", make_device("host"), new_tokens=12)
    assert real.mini is not None and real.chain()[0].startswith("mini Engine")
    assert [s.table for s in real.snapshots] == [s.table for s in sim.snapshots]
    assert len(ours.output) == 12 and nb.prefix_hit_tokens == 96
    assert real.kv.used_blocks == 0
    real.mini.close()


def test_table_and_page_map_figures():
    eng, *_ = walk("vllm", new_tokens=4)
    g = eng.kv.geometry
    s2 = eng.snapshots[2]
    fig = table_figure(g, s2, "vllm")
    assert fig.layout.title.text.startswith("step 2 · ")
    labels = [t for tr in fig.data for t in (tr.text or [])]
    assert "b8" in labels and "p1" in labels  # block 8 lies on page 1
    empty = table_figure(g, eng.snapshots[0], "vllm")
    assert "holds no KV (waiting)" in empty.layout.title.text
    pm = walk_page_map(eng.rec, s2, width=16)
    assert list(pm.data[-1].x) == [0, 1] and list(pm.data[-1].y) == [0, 0]
    fp = footprint(g, eng.snapshots)
    assert fp["kv tokens"][:4] == [0, 64, 128, 160]
    assert fp["slots held"][:4] == [0, 64, 128, 160]
    assert fp["pages touched"][:4] == [0, 1, 2, 2]


def test_walk_explorer_slider_redraws_the_figures():
    pytest.importorskip("ipywidgets")
    eng, *_ = walk("sglang", new_tokens=4)
    box = walk_explorer(eng, live=True)
    (play, slider), table, pmap, foot = box.children[0].children, *box.children[1:]
    assert slider.value == play.value == len(eng.snapshots) - 1
    slider.value = 1
    assert list(pmap.data[-1].x) == [0]  # blocks 1-4: page 0 only
    assert table.layout.title.text.startswith("step 1 · extend batch")
    assert foot.layout.shapes[0].x0 == 1
    assert "req_to_token" in str(table.layout.yaxis.ticktext)


def test_walk_table_text():
    eng, *_ = walk("vllm", new_tokens=2, neighbour_at=None)
    lines = walk_table(eng.snapshots).splitlines()
    assert lines[2].split()[:4] == ["1", "running", "64/160", "1,2,3,4"]
    assert "finished: blocks released" in lines[-2]


def test_engine_core_split_messages():
    r = engine_core_split(tp=2)
    labels = [(m.src, m.dst, m.label.split(" tx ")[0]) for m in r.messages]
    w0, w1 = "pp0/w0", "pp0/w1"
    assert labels == [
        ("EngineCore", w0, "MAP page 1"), ("EngineCore", w1, "MAP page 1"),
        (w0, "EngineCore", "map: ok"), (w1, "EngineCore", "map: ok"),
        ("EngineCore", w0, "PREPARE page 1"), ("EngineCore", w1, "PREPARE page 1"),
        (w0, "EngineCore", "prepare: prepared"), (w1, "EngineCore", "prepare: prepared"),
        ("EngineCore", w0, "COMMIT"), ("EngineCore", w1, "COMMIT"),
        (w0, "EngineCore", "commit: committed"), (w1, "EngineCore", "commit: committed")]
    assert r.messages[0].t == 0.0 and all(m.ok for m in r.messages)
    assert r.worker_pages == {w0: [0], w1: [0]} and r.decisions == 2
    assert r.participants == ["EngineCore", w0, w1]
    assert len(engine_core_split(tp=4).messages) == 24


def test_sglang_ranks_decide_alike_and_send_nothing():
    r = sglang_ranks(tp=3)
    assert r.messages == 0
    assert r.pages == {f"sglang.tp{i}": [0, 1] for i in range(3)}
    states = r.rec.states_at(r.busiest)
    assert states["sglang.tp0"] == states["sglang.tp1"] == states["sglang.tp2"]
    assert states["sglang.tp0"][:2] == ["in_use", "in_use"]
    assert r.rec.states_at(None)["sglang.tp0"][1] == "free"  # no reserve: unmapped at the end
    assert WALK_GEOMETRY.page_size // WALK_GEOMETRY.block_bytes == 8


def _serve(kind: str, backend: str = "sim"):
    from workbench.engines.sched.request import Request
    from workbench.viz.serving import serving_engine

    eng = serving_engine(kind, backend)
    prompt = prompt_tokens(160)
    eng.submit([Request(0, prompt, 24, arrival=0.0),
                Request(1, prompt[:96] + prompt_tokens(40, salt=1), 8, arrival=0.02)])
    eng.advance()
    return eng


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_serving_engine_through_the_engine_protocol(kind):
    from workbench.engines.base import Engine
    from workbench.viz.serving import settled, timeline_figure

    eng = _serve(kind)
    assert isinstance(eng, Engine) and not eng.has_work()
    m = eng.metrics()
    assert m.finished == 2 and m.prefix_hit_tokens == 96
    assert 0 < m.ttft.mean < 0.05  # simulated seconds: a 160-token prefill on an H200 preset
    tl = eng.memory_timeline()
    page_id = 128 << 20  # Llama-3.1-8B: 2 MiB x 32 layers x K and V
    assert {s.mapped_bytes for s in tl} == {6 * page_id}  # null page + 5 reserved, never more
    assert max(s.used_blocks for s in tl) >= 13  # 184 tokens of ours + the neighbour's tail
    cut = settled(tl)
    assert len(cut) < len(tl) and cut[-1].used_blocks == tl[-1].used_blocks
    fig = timeline_figure(tl)
    assert [tr.name for tr in fig.data] == [f"{kind}: blocks in use", f"{kind}: mapped MiB"]
    assert list(fig.data[1].y) == [768.0] * len(cut)


def test_serving_engine_refuses_sglang_with_a_real_model():
    from workbench.viz.serving import serving_engine

    with pytest.raises(ConfigError, match="schedules like vLLM only"):
        serving_engine("sglang", "host")
    with pytest.raises(ConfigError, match="use one of vllm, sglang"):
        serving_engine("trt", "sim")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="host memory needs memfd")
def test_serving_engine_mini_on_host_memory():
    pytest.importorskip("torch")
    from workbench.mini.instance import MiniInstance

    eng = _serve("vllm", "host")
    assert isinstance(eng, MiniInstance)
    m = eng.metrics()
    assert m.finished == 2 and m.prefix_hit_tokens == 96
    assert [len(s.output) for s in eng.seqs] == [24, 8]
    eng.engine.close()
