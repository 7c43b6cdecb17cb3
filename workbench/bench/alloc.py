"""Allocator throughput on the simulated backend: how fast the core itself decides.

Each round allocates ``n`` blocks and frees them again on a pool whose reserve is large enough
that the pages stay mapped, so the figure is the cost of the ledger and page allocator in Python
(plus the simulated device's bookkeeping), not of the VMM calls — those the device presets price.
"""

from __future__ import annotations

import statistics
import time

from workbench.bench.params import check
from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.sim.device import SimDevice


def alloc_throughput(sizes=(1, 16, 256, 1024), seconds: float = 0.5, repeats: int = 5) -> dict:
    """Median allocs/s (an alloc + its free = one op) per request size, over ``repeats`` runs."""
    ok = check("alloc", sizes=sizes, seconds=seconds, repeats=repeats)
    sizes, seconds, repeats = ok["sizes"], ok["seconds"], ok["repeats"]
    geo = KVGeometry(num_layers=32, kv_heads=8, head_dim=128, block_size=16, num_blocks=65536)
    out = {}
    for n in sizes:
        rates = []
        for _ in range(repeats):
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


def grow_shrink_overhead(rounds: int = 2000, repeats: int = 7, num_layers: int = 32) -> dict:
    """The core's own cost per page id grown and shrunk (the Python above the device).

    A Llama-8B-like pool (contiguous, one 128 MiB page id per 64-block alloc, no reserve) grows
    one page id with ``alloc(64)`` and shrinks it with ``free``; the same simulated device calls
    made directly (create + map + set_access, then unmap + release) are timed in the same run and
    subtracted. Medians over ``repeats`` runs of ``rounds`` grow/shrink pairs, in microseconds.
    This is the pure-Python part of ``workbench bench vmm``'s workbench-vs-raw ratio.
    """
    geo = KVGeometry(num_layers=num_layers, kv_heads=8, head_dim=128, block_size=16,
                     num_blocks=64 * 200)
    cfg = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=0)
    bpp = geo.page_size // geo.block_bytes
    size = geo.page_id_bytes
    clock = time.perf_counter
    wb_g, wb_s, raw_g, raw_s = [], [], [], []
    for _ in range(repeats):
        kv = KVCacheManager(geo, SimDevice("h200"), name="bench", config=cfg)
        filler = kv.alloc(bpp - 1)  # the rest of the null block's page: each alloc maps a page
        dev = SimDevice("h200")
        base = dev.reserve(size * 2)
        va = base + size
        tg = ts = rg = rs = 0.0
        for _ in range(rounds):
            t0 = clock()
            ids = kv.alloc(bpp)
            t1 = clock()
            kv.free(ids)
            t2 = clock()
            h = dev.create(size)
            dev.map(va, size, h)
            dev.set_access(va, size)
            t3 = clock()
            dev.unmap(va, size)
            dev.release(h)
            t4 = clock()
            tg += t1 - t0
            ts += t2 - t1
            rg += t3 - t2
            rs += t4 - t3
        wb_g.append(tg / rounds)
        wb_s.append(ts / rounds)
        raw_g.append(rg / rounds)
        raw_s.append(rs / rounds)
        kv.free(filler)
        kv.close()
        dev.unreserve(base, size * 2)
    us = {k: statistics.median(v) * 1e6 for k, v in
          (("workbench_grow_us", wb_g), ("workbench_shrink_us", wb_s),
           ("raw_grow_us", raw_g), ("raw_shrink_us", raw_s))}
    over = [(a + b) - (c + d) for a, b, c, d in zip(wb_g, wb_s, raw_g, raw_s, strict=True)]
    us["overhead_grow_us"] = us["workbench_grow_us"] - us["raw_grow_us"]
    us["overhead_shrink_us"] = us["workbench_shrink_us"] - us["raw_shrink_us"]
    us["overhead_us"] = statistics.median(over) * 1e6
    return us
