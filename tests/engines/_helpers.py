from __future__ import annotations

import pytest

from workbench.config import PoolConfig
from workbench.core.events import EventLog, PageState
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.sim.device import SimDevice

GiB = 1 << 30


def make_kv(num_blocks: int = 64, *, blocks_per_page: int = 4, block_size: int = 4,
            max_cached_tokens: int = -1, prealloc: bool = False, max_reserved: int = 0,
            device: SimDevice | None = None, name: str = "pool") -> KVCacheManager:
    """A small pool: ``blocks_per_page`` blocks on each 2 MiB page, one layer."""
    heads = (2 << 20) // (blocks_per_page * block_size * 2 * 64)
    geo = KVGeometry(num_layers=1, kv_heads=heads, head_dim=64, block_size=block_size,
                     num_blocks=num_blocks)
    assert geo.page_size // geo.block_bytes == blocks_per_page
    cfg = PoolConfig(prealloc=prealloc, min_reserved_pages=0, max_reserved_pages=max_reserved,
                     max_cached_tokens=max_cached_tokens)
    return KVCacheManager(geo, device or SimDevice("h200", capacity=4 * GiB), name=name,
                          config=cfg, events=EventLog(keep=False))


def in_use_pages(kv: KVCacheManager) -> int:
    return kv.pages.counts[PageState.IN_USE]


@pytest.fixture
def kv():
    return make_kv()
