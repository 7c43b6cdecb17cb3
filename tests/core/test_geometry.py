from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.core.geometry import KVGeometry, Layout
from workbench.core.vspace import KVSpace
from workbench.errors import ConfigError
from workbench.sim.device import MiB, SimDevice


def test_llama_8b_numbers():
    g = KVGeometry(num_layers=32, kv_heads=8, head_dim=128, block_size=16, num_blocks=4096)
    assert g.block_bytes == 16 * 8 * 128 * 2 == 32 * 1024
    assert g.blocks_per_page(0) == 64
    assert g.page_id_bytes == 2 * MiB * 32 * 2
    assert g.maps_per_page == 1
    per_layer = KVGeometry(num_layers=32, kv_heads=8, head_dim=128, layout=Layout.PER_LAYER)
    assert per_layer.maps_per_page == 64


def test_mla_has_one_latent_buffer():
    g = KVGeometry.for_model(num_layers=27, kv_heads=16, head_dim=576, mla=True, block_size=64)
    assert g.num_buffers == 1 and g.kv_heads == 1
    assert g.block_bytes == 64 * 576 * 2


@pytest.mark.parametrize("kw, words", [
    (dict(block_size=1024, kv_heads=32), "does not fit"),
    (dict(block_size=16, kv_heads=96, head_dim=1024, page_size=4 * MiB), "no whole block"),
    (dict(num_buffers=3), "MLA"),
    (dict(num_layers=0), "positive"),
])
def test_validation_names_the_fix(kw, words):
    base = dict(num_layers=4, kv_heads=8, head_dim=128)
    with pytest.raises(ConfigError, match=words) as err:
        KVGeometry(**{**base, **kw})
    assert "Fix:" in str(err.value)


def test_page_size_must_match_granularity():
    g = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, page_size=3 * MiB)
    with pytest.raises(ConfigError, match="granularity"):
        KVSpace(g, SimDevice())


def test_tensors_must_match_the_pool():
    g = KVGeometry(num_layers=4, kv_heads=8, head_dim=128)
    g.check_tensors(4, 2)
    with pytest.raises(ConfigError, match="4 layers x 2 buffers"):
        g.check_tensors(4, 1)


@given(block_tokens=st.integers(1, 64), heads=st.integers(1, 16),
       dim=st.sampled_from([64, 80, 96, 128, 192, 576]), blocks=st.integers(2, 3000))
def test_blocks_never_straddle_and_partition(block_tokens, heads, dim, blocks):
    try:
        g = KVGeometry(num_layers=1, kv_heads=heads, head_dim=dim, block_size=block_tokens,
                       num_blocks=blocks)
    except ConfigError:
        return
    seen = []
    for p in range(g.num_pages):
        for b in g.page_blocks(p):
            start, end = b * g.block_bytes, (b + 1) * g.block_bytes
            assert p * g.page_size <= start and end <= (p + 1) * g.page_size
            assert g.block_page(b) == p
            seen.append(b)
    # every block but those that would straddle a boundary has exactly one page
    straddling = [b for b in range(blocks)
                  if (b * g.block_bytes) // g.page_size
                  != ((b + 1) * g.block_bytes - 1) // g.page_size]
    assert sorted(seen + straddling) == list(range(blocks))
    assert all(g.blocks_per_page(p) >= 1 for p in range(g.num_pages - 1))


@pytest.mark.parametrize("layout", list(Layout))
def test_views_address_distinct_bytes(layout):
    g = KVGeometry(num_layers=3, kv_heads=2, head_dim=64, block_size=16, num_blocks=300,
                   layout=layout)
    space = KVSpace(g, SimDevice())
    spans = set()
    for layer in range(3):
        for buf in range(2):
            for b in range(g.num_blocks):
                addr = space.block_address(layer, buf, b)
                page = g.block_page(b)
                assert any(t.va <= addr and addr + g.block_bytes <= t.va + t.size
                           for t in space.targets(page))
                spans.add(addr)
    assert len(spans) == 3 * 2 * g.num_blocks
