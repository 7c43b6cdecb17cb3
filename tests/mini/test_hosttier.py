"""The mini engine's host KV tier on the CPU (tiny model): a prefix retrieved from host memory
gives the tokens a full recompute gives and an HBM (prefix-cache) hit gives; the tier keeps its
capacity, the chain rule and LRU, and every byte it hands back is the byte it saved."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from workbench.errors import ConfigError  # noqa: E402
from workbench.mini.engine import Engine, EngineConfig  # noqa: E402
from workbench.mini.hosttier import HostTier, attach_host_tier  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import build_model, get_config  # noqa: E402
from workbench.tiers.model import chunk_keys  # noqa: E402

CFG = get_config("tiny")
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the host VMM device needs Linux memfd")
DOC = [(i * 37 + 11) % 256 for i in range(200)]
Q1, Q2 = [5, 9, 200, 17, 3], [44, 1, 8]


@pytest.fixture(scope="module")
def model():
    return build_model(CFG)


def _engine(model, backend="static", caching=False):
    return Engine(CFG, KVSpec(backend=backend, kv_bytes=4 << 20, block_size=16), model=model,
                  cfg=EngineConfig(prefix_caching=caching))


@pytest.mark.parametrize("backend", ["static", pytest.param("vmm", marks=linux_only)])
def test_host_retrieve_gives_the_tokens_of_recompute_and_of_an_hbm_hit(model, backend):
    probe = DOC + Q2
    full = _engine(model, backend).generate([probe], 12)[0]  # no cache at all
    hbm = _engine(model, backend, caching=True)
    hbm.generate([DOC + Q1], 4)
    assert hbm.generate([probe], 12)[0] == full
    eng = _engine(model, backend)
    conn = attach_host_tier(eng, capacity_bytes=1 << 20, chunk_tokens=64)
    eng.generate([DOC + Q1], 4)
    assert conn.saves["cmpl-0"].chunks == len(DOC + Q1) // 64
    out = eng.generate([probe], 12)[0]
    ld = conn.loads["cmpl-1"]
    assert ld.tokens == 192 and ld.chunks == 3  # 200 doc tokens: three whole 64-token chunks
    assert ld.nbytes == 192 // 16 * eng.kv.block_rows().shape[1]
    assert out == full
    for e in (hbm, eng):
        e.close()


def test_a_changed_token_stops_the_chain_there(model):
    eng = _engine(model)
    conn = attach_host_tier(eng, capacity_bytes=1 << 20, chunk_tokens=64)
    eng.generate([DOC + Q1], 2)
    other = DOC[:100] + [(DOC[100] + 1) % 256] + DOC[101:] + Q2  # differs inside chunk 1
    ref = _engine(model).generate([other], 8)[0]
    assert eng.generate([other], 8)[0] == ref
    assert conn.loads["cmpl-1"].tokens == 64
    eng.close()


def test_hbm_hit_then_the_host_tier_supplies_only_the_rest(model):
    eng = _engine(model, caching=True)
    conn = attach_host_tier(eng, capacity_bytes=1 << 20, chunk_tokens=64)
    eng.generate([DOC + Q1], 2)
    eng.pool.reset_prefix_cache()
    eng.generate([DOC[:70] + [1, 2]], 2)  # re-caches the first 64 tokens in HBM (4 blocks)
    ref = _engine(model).generate([DOC + Q2], 8)[0]
    assert eng.generate([DOC + Q2], 8)[0] == ref
    ld = conn.loads["cmpl-2"]
    assert ld.skip_tokens == 64 and ld.tokens == 128 and ld.blocks == 8
    eng.close()


def test_a_tier_that_holds_no_chunk_is_refused():
    rows = torch.zeros(8, 32, dtype=torch.uint8)
    with pytest.raises(ConfigError, match="holds no chunk"):
        HostTier(rows, block_size=16, chunk_tokens=32, capacity_bytes=63)
    with pytest.raises(ConfigError, match="whole blocks"):
        HostTier(rows, block_size=16, chunk_tokens=24, capacity_bytes=1 << 10)


chains = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=7), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(chains, st.integers(1, 6), st.randoms(use_true_random=False))
def test_capacity_chain_rule_lru_and_bytes(seqs, cap, rnd):
    """Random save/lookup traffic over a 4-block KV: the tier's invariants after every step."""
    bs, ct, row = 2, 4, 8  # 2-token blocks, 2 blocks a chunk, 8-byte rows
    rows = torch.zeros(64, row, dtype=torch.uint8)
    tier = HostTier(rows, block_size=bs, chunk_tokens=ct, capacity_bytes=cap * 2 * row)
    saved: dict[int, torch.Tensor] = {}
    for i, s in enumerate(seqs):
        toks = [t % 2 for t in s for _ in range(2)]  # few distinct chains: many shared keys
        blocks = rnd.sample(range(64), len(toks) // bs)
        keys = chunk_keys(toks, ct)
        before = set(tier.slot)
        if i % 2 == 0:
            rows[blocks] = torch.randint(0, 255, (len(blocks), row), dtype=torch.uint8)
            tier.save(toks, blocks)
            for j, k in enumerate(keys[:cap]):
                if k not in before:
                    saved[k] = rows[blocks[2 * j:2 * j + 2]].clone()
            assert all(k in tier.slot for k in keys[:cap])  # the head is kept
        else:
            n = tier.lookup(toks)
            hit = n // ct
            assert hit == next((j for j, k in enumerate(keys[:(len(toks) - 1) // ct])
                                if k not in tier.slot), min(len(keys), (len(toks) - 1) // ct))
            ld = tier.load(toks, 0, blocks)
            assert ld.tokens == n and ld.nbytes == hit * 2 * row
            for j in range(hit):
                assert torch.equal(rows[blocks[2 * j:2 * j + 2]], saved[keys[j]])
            if hit:  # a load makes its chain the most recent, head last
                assert list(tier.tier.lru)[-1] == keys[0]
        assert len(tier.slot) <= cap and len(set(tier.slot.values())) == len(tier.slot)
        assert set(tier.slot) == set(tier.tier.lru)
