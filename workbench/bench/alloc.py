"""Allocator throughput on the simulated backend: how fast the core itself decides.

Each round allocates ``n`` blocks and frees them again on a pool whose reserve is large enough
that the pages stay mapped, so the figure is the cost of the ledger and page allocator in Python
(plus the simulated device's bookkeeping), not of the VMM calls — those the device presets price.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.sim.device import SimDevice


def alloc_throughput(sizes=(1, 16, 256, 1024), seconds: float = 0.5, repeats: int = 5,
                     progress: Callable[[str], None] | None = None) -> dict:
    """Median allocs/s (an alloc + its free = one op) per request size, over ``repeats`` runs;
    ``progress(message)`` hears each measurement start."""
    geo = KVGeometry(num_layers=32, kv_heads=8, head_dim=128, block_size=16, num_blocks=65536)
    out = {}
    for n in sizes:
        rates = []
        for r in range(repeats):
            if progress:
                progress(f"{n} blocks, run {r + 1}/{repeats}")
            kv = KVCacheManager(geo, SimDevice("h200"), name=f"bench{n}",
                                config=PoolConfig(min_reserved_pages=0, max_reserved_pages=64))
            ids = kv.alloc(n)  # warm: map the pages once
            kv.free(ids)
            count, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds:
                for _ in range(20):
                    kv.free(kv.alloc(n))
                count += 20
            rates.append(count / elapsed)
            kv.close()
        out[n] = {"allocs_per_s": statistics.median(rates),
                  "blocks_per_s": statistics.median(rates) * n,
                  "us_per_alloc_free": 1e6 / statistics.median(rates)}
    return out
