"""Decode graphs and the req_to_token table on a CPU: graphs refused in one line; the device-side
slot table equals the slots the host would build, over random schedules."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from workbench.errors import ConfigError  # noqa: E402
from workbench.mini.attention import reference_decode  # noqa: E402
from workbench.mini.engine import Engine, EngineConfig  # noqa: E402
from workbench.mini.graphs import DecodeGraphs, capture_sizes  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import build_model, get_config  # noqa: E402

CFG = get_config("tiny")


@pytest.fixture(scope="module")
def model():
    return build_model(CFG)


def _engine(model, style="token", block_size=1, blocks=64, **kw) -> Engine:
    kv = blocks * block_size * CFG.kv_bytes_per_token
    return Engine(CFG, KVSpec(style=style, backend="static", kv_bytes=kv, block_size=block_size),
                  model=model, cfg=EngineConfig(**kw))


def test_graphs_are_off_by_default_and_refused_in_one_line_on_cpu(model):
    eng = _engine(model)
    assert eng.graphs is None
    eng.close()
    with pytest.raises(ConfigError) as err:
        _engine(model, cuda_graphs=True)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("cuda_graphs=True on cpu: CUDA graphs need a CUDA device. Fix: ")


def test_decode_graphs_refuse_a_cpu_store_directly(model):
    eng = _engine(model, style="block", block_size=16)
    with pytest.raises(ConfigError, match="need a CUDA device"):
        DecodeGraphs(model, eng.kv, sizes=(1, 2), scale=1.0, impl="torch", r2t=eng.r2t)
    eng.close()


def test_capture_sizes_pad_like_vllm():
    assert capture_sizes(1) == (1,)
    assert capture_sizes(6) == (1, 2, 4, 6)
    assert capture_sizes(64) == (1, 2, 4, 8, 16, 32, 48, 64)
    assert capture_sizes(40) == (1, 2, 4, 8, 16, 32, 40)


def test_the_device_table_holds_slots_or_blocks(model):
    for style, bs, width in (("token", 4, CFG.max_position), ("block", 16, CFG.max_position // 16)):
        eng = _engine(model, style=style, block_size=bs)
        assert eng.r2t.entry_tokens == (1 if style == "token" else 16)
        assert tuple(eng.r2t.table.shape) == (65, width)  # max_num_seqs rows + the padding row
        eng.close()


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lens=st.lists(st.integers(1, 30), min_size=1, max_size=6),
       gens=st.lists(st.integers(2, 12), min_size=6, max_size=6),
       style=st.sampled_from(["token", "block"]), page=st.sampled_from([1, 4, 16]),
       blocks=st.integers(14, 40), seqs=st.integers(1, 4),
       budget=st.sampled_from([4, 16, 64]), prefix=st.booleans(), shared=st.integers(0, 12),
       abort_at=st.integers(2, 9))
def test_req_to_token_equals_host_slot_tables(model, lens, gens, style, page, blocks, seqs,
                                              budget, prefix, shared, abort_at):
    """After every step, each running request's row holds the slot of each computed position
    (token style) or its block ids (block style): what the host used to rebuild each step,
    through preemptions, prefix hits and aborts."""
    eng = _engine(model, style=style, block_size=page, blocks=blocks, max_num_seqs=seqs,
                  max_batched_tokens=budget, prefix_caching=prefix)
    room = (blocks - 1) * page
    head = [(3 * j + 1) % CFG.vocab_size for j in range(shared)]  # a shared prefix: cache hits
    seqs_in = []
    for i, n in enumerate(lens):
        prompt = (head + [(i * 11 + j * 5 + 2) % CFG.vocab_size for j in range(n)])[:room - 2]
        seqs_in.append(eng.add_request(prompt, min(gens[i], room - len(prompt))))
    checked = steps = 0
    while eng.has_work() and steps < 400:
        eng.step()
        steps += 1
        if steps == abort_at and seqs_in[0].num_computed:
            eng.abort(seqs_in[0])
        for seq in eng.scheduler.running:
            nc = seq.num_computed
            slots = [eng._slot(seq, p) for p in range(nc)]
            row = eng.r2t.row_of(seq)
            assert eng.r2t.slots(row, nc).tolist() == slots
            if style == "token":
                assert eng.r2t.table[row, :nc].tolist() == slots
            else:
                n_blocks = -(-nc // page)
                assert eng.r2t.table[row, :n_blocks].tolist() == seq.blocks[:n_blocks]
            checked += 1
        assert eng.r2t.rows_in_use <= seqs
    assert not eng.has_work() and checked > 0
    assert eng.r2t.table[eng.r2t.pad_row].eq(0).all()
    eng.close()


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 6), rows_total=st.integers(6, 9), seed=st.integers(0, 2**16))
def test_reference_decode_through_rows_equals_gathered_table(b, rows_total, seed):
    gen = torch.Generator().manual_seed(seed)
    kc = torch.randn(40, 1, 2, 8, generator=gen)
    vc = torch.randn(40, 1, 2, 8, generator=gen)
    table = torch.randint(1, 40, (rows_total, 12), generator=gen, dtype=torch.int32)
    rows = torch.randperm(rows_total, generator=gen)[:b]
    lens = torch.randint(1, 13, (b,), generator=gen)
    q = torch.randn(b, 4, 8, generator=gen)
    got = reference_decode(q, kc, vc, table, lens, 1, 0.3, rows)
    assert torch.equal(got, reference_decode(q, kc, vc, table[rows], lens, 1, 0.3))
