"""Torch views over the host device: engines read and write KV through them, no copies."""

from __future__ import annotations

import pytest

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.host.device import HostDevice
from workbench.units import MiB

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("layout", list(Layout))
def test_block_views_hit_the_right_bytes(layout):
    dev = HostDevice(capacity=256 * MiB)
    geo = KVGeometry(num_layers=2, kv_heads=2, head_dim=32, block_size=16, num_blocks=4096,
                     layout=layout)
    kv = KVCacheManager(geo, dev, config=PoolConfig(
        contiguous_layout=layout is Layout.CONTIGUOUS, min_reserved_pages=0,
        max_reserved_pages=0))
    from workbench.host.views import layer_buffer_view

    views = {(li, b): layer_buffer_view(kv.space, li, b, torch.float16)
             for li in range(2) for b in range(2)}
    assert views[0, 0].shape == (4096, 16, 2, 32)
    ids = kv.alloc(1500)
    for (li, b), t in views.items():
        t[ids] = float(10 * li + b + 1)
    for (li, b), t in views.items():
        assert (t[ids] == float(10 * li + b + 1)).all()
        # byte-exact: the first element of each block is where block_address says
        addr = kv.space.block_address(li, b, ids[7])
        assert t[ids[7]].data_ptr() == addr
    untouched = [i for i in range(1, 4096) if i not in set(ids)][-1]
    assert (views[1, 1][untouched] == 0).all()  # unmapped page reads the zero page
    kv.free(ids)
    assert (views[0, 0][ids[-1]] == 0).all()  # its page was unmapped: zeros again
    kv.close()
    dev.close()
