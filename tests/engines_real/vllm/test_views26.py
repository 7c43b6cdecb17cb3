"""vLLM 0.26's per-layer KV views (``worker26._layer_view``) over a workbench range, without
vLLM: for the Triton shape (blocks first, K and V packed in the last dim, NHD stride order) and
the FlashAttention shape (K/V first), in both layouts, block ``b`` of layer ``l`` is exactly the
bytes the ledger's geometry places there, so a page holds whole blocks of every layer."""

from __future__ import annotations

import pytest
import torch

from workbench.adapters.vllm.ledger import BlockLedger
from workbench.adapters.vllm.worker26 import _layer_view
from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.units import MiB

NB, BS, H, D, L = 128, 16, 4, 64, 3  # 16-token blocks of 4 heads x 64: 16 KiB (K+V) in bf16


def _views(shape, order, buffers, layout):
    block = 2 * BS * H * D * 2
    geo = KVGeometry(num_layers=L, kv_heads=1, head_dim=block // buffers // 2, block_size=1,
                     num_blocks=NB, num_buffers=buffers, dtype_bytes=2, page_size=2 * MiB,
                     layout=layout)
    cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, min_reserved_pages=0)
    kv = BlockLedger(geo, make_device("host"), name="v26", config=cfg)
    kv.hold(range(1, NB))
    flat = kv.space.device.tensor(kv.space.base, kv.space.size, torch.bfloat16)
    return kv, flat, [_layer_view(kv, flat, li, shape, order, buffers, 1) for li in range(L)]


@pytest.mark.parametrize("layout", [Layout.CONTIGUOUS, Layout.PER_LAYER])
def test_triton_blocks_first_views_put_each_block_where_the_geometry_says(layout):
    shape, order = (NB, H, BS, 2 * D), (0, 2, 1, 3)  # logical (B, H, N, 2D), stored NHD
    kv, flat, views = _views(shape, order, 1, layout)
    for li, v in enumerate(views):
        assert tuple(v.shape) == shape
        for k, b in enumerate((1, 37, NB - 1)):
            v[b].fill_(li * 3 + k + 1)  # small integers: exact in bf16
    for li in range(L):
        for k, b in enumerate((1, 37, NB - 1)):
            at = (kv.space.block_address(li, 0, b) - kv.space.base) // 2
            chunk = flat[at:at + 2 * BS * H * D]
            assert bool((chunk == li * 3 + k + 1).all())
    # nothing outside those blocks was written
    assert float(flat.float().sum()) == sum(BS * H * 2 * D * (li * 3 + k + 1)
                                            for li in range(L) for k in range(3))
    kv.close()


@pytest.mark.parametrize("layout", [Layout.CONTIGUOUS, Layout.PER_LAYER])
def test_kv_first_views_keep_k_and_v_of_a_block_on_its_page(layout):
    shape, order = (2, NB, BS, H, D), (0, 1, 2, 3, 4)
    kv, flat, views = _views(shape, order, 2, layout)
    for li, v in enumerate(views):
        v[0, 5].fill_(1.0 + li)
        v[1, 5].fill_(-1.0 - li)
        for buf, sign in ((0, 1.0), (1, -1.0)):
            at = (kv.space.block_address(li, buf, 5) - kv.space.base) // 2
            assert bool((flat[at:at + BS * H * D] == sign * (1.0 + li)).all())
    kv.close()
