"""Chapter 09's group arithmetic and the hybrid decode run on one pool."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.errors import ConfigError
from workbench.units import KiB
from workbench.viz.groups import (
    LayerSpec,
    arithmetic,
    arithmetic_figure,
    held_figure,
    hybrid_decode,
    owner_figure,
    skipped_blocks,
    unify,
)

GQA = LayerSpec("gqa", "full", 32, kv_heads=8, head_dim=128)
MLA = LayerSpec("mla", "mla", 27, kv_heads=1, head_dim=576)
SWA = LayerSpec("swa", "sliding", 32, kv_heads=8, head_dim=128, window=4096)
MAMBA = LayerSpec("mamba", "mamba", 8, state_shapes=((3, 4352), (64, 64, 128)),
                  state_dtype_bytes=(2, 4))


def test_block_bytes_per_kind():
    assert GQA.block_bytes == 2 * 16 * 8 * 128 * 2 == 64 * KiB  # K and V
    assert MLA.block_bytes == 16 * 576 * 2 == 18 * KiB  # one latent buffer
    assert SWA.block_bytes == GQA.block_bytes
    assert MAMBA.block_bytes == 3 * 4352 * 2 + 64 * 64 * 128 * 4  # a state, no tokens
    with pytest.raises(ConfigError, match="keeps a state"):
        MAMBA.geometry()
    with pytest.raises(ConfigError, match="has no window"):
        LayerSpec("x", "sliding", 1, kv_heads=1, head_dim=64)


def test_blocks_held_per_kind():
    assert GQA.blocks_held(10_000) == 625
    assert MLA.blocks_held(10_000) == 625
    assert MAMBA.blocks_held(10_000) == 1
    # window 4096: tokens 5905.. are useful; blocks 0..368 skipped; 625 - 369 = 256
    assert skipped_blocks(10_000, 4096, 16) == (10_000 - 4096 + 1) // 16 == 369
    assert SWA.blocks_held(10_000) == 256
    assert SWA.blocks_held(100) == 7  # shorter than the window: nothing skipped


@given(st.integers(1, 50_000), st.integers(1, 5000), st.sampled_from([1, 4, 16, 64]))
def test_sliding_holds_every_block_the_window_touches(tokens, window, bs):
    s = LayerSpec("s", "sliding", 1, kv_heads=1, head_dim=64, block_size=bs, window=window)
    held = s.blocks_held(tokens)
    first_useful = max(0, tokens - window + 1)
    assert held == (tokens - 1) // bs - first_useful // bs + 1  # last block - first block + 1
    assert held <= -(-tokens // bs) and held <= -(-window // bs) + 1


def test_unify_grows_smaller_blocks_and_pads_state():
    small = LayerSpec("small", "full", 4, kv_heads=2, head_dim=128)  # 16 KiB blocks
    with pytest.raises(ConfigError, match="'gqa' with 65536-byte blocks"):
        unify([GQA, small, MAMBA])  # the state (2,123,264 B) is no multiple of 64 KiB
    grown = LayerSpec("gqa", "full", 32, kv_heads=8, head_dim=128, block_size=16 * 33)
    out = unify([grown, small, MAMBA])  # 33 x 64 KiB >= the state: now it is padded
    assert [s.block_bytes for s in out] == [33 * 64 * KiB] * 3
    assert out[1].block_size == 16 * 4 * 33 and out[2].padded_bytes == 33 * 64 * KiB
    big_state = LayerSpec("m", "mamba", 1, state_shapes=((1000,),), state_dtype_bytes=(2,))
    u = unify([GQA, big_state])
    assert u[0] == GQA and u[1].padded_bytes == 64 * KiB and u[1].block_bytes == 64 * KiB
    u = unify([GQA, small])
    assert u[1].block_size == 64 and u[1].block_bytes == 64 * KiB
    odd = LayerSpec("odd", "full", 1, kv_heads=3, head_dim=128)  # 24 KiB: 64 is no multiple
    with pytest.raises(ConfigError, match="whole number of tokens"):
        unify([GQA, odd])


def test_arithmetic_rows():
    rows = arithmetic([GQA, MLA, SWA], tokens=10_000)
    assert [(r["group"], r["blocks/VMM page"], r["blocks held"]) for r in rows] == [
        ("gqa", 32, 625), ("mla", 113, 625), ("swa", 32, 256)]
    assert rows[0]["MiB held"] == round(625 * 64 * KiB * 32 / 2**20, 2) == 1250.0
    assert len(arithmetic_figure(rows).data[0].x) == 3


def _groups():
    full = LayerSpec("full", "full", 2, kv_heads=8, head_dim=128)
    return [full, LayerSpec("sw-a", "sliding", 2, kv_heads=8, head_dim=128, window=64),
            LayerSpec("sw-b", "sliding", 2, kv_heads=8, head_dim=128, window=64)]


def test_hybrid_decode_shares_one_pool_and_keys_by_group():
    run = hybrid_decode(_groups(), requests=3, prompt=96, steps=12, tokens_per_step=16)
    assert run.tokens == [288, 288, 288]
    assert run.held["full"] == [18 + 3 * k for k in range(13)]  # 6 blocks each, +1 per step
    assert run.held["sw-a"] == run.held["sw-b"] == [12] * 13  # 4 blocks each: the window
    assert len({h for h, _ in run.keys}) == 1 and sorted(g for _, g in run.keys) == [0, 1, 2]
    first = run.keys[0][0]
    assert run.pool.get_cached_block(first, (0, 1, 2)) is not None  # every group hits
    counts = {o: run.owner.count(o) for o in set(run.owner)}
    assert counts["full"] == 54 and counts["sw-a"] == counts["sw-b"] == 12
    assert counts["cached"] == 2 * 3 * 6  # 2 sliding groups x 3 requests x 6 prompt blocks
    run.pool.kv.check_invariants()
    assert held_figure(run).data[0].y == tuple(run.held["full"])
    assert owner_figure(run).data[0].z[0][0] == 0  # block 0: the null block, never handed out


def test_a_zero_cache_bound_returns_the_sliding_blocks():
    kept = hybrid_decode(_groups(), max_cached_tokens=-1)
    bounded = hybrid_decode(_groups(), max_cached_tokens=0)
    assert "cached" not in bounded.owner
    assert bounded.pool.get_cached_block(bounded.keys[0][0], (0, 1, 2)) is None  # one group gone
    mapped = lambda r: r.rec.series()["hybrid"]["mapped"]  # noqa: E731
    assert mapped(bounded)[3] < mapped(kept)[3]


def test_hybrid_decode_refuses_state_groups_and_a_full_pool():
    with pytest.raises(ConfigError, match="attention groups"):
        hybrid_decode([_groups()[0], MAMBA])
    with pytest.raises(ConfigError, match="no .* free blocks"):
        hybrid_decode(_groups(), requests=3, num_blocks=40)
