"""Round-trip cost of a page decision across real worker processes, per page id.

``python -m workbench.bench.transport --tp 1 2`` starts TP worker processes (SimDevice memory by
default; ``--backend host`` for real memfd/mmap pages, ``--backend gpu`` for CUDA VMM), then
times ``map_page`` and ``unmap_page`` through the coordinator: one map is one round trip to
every rank; an unmap is one round trip at TP=1 (prepare carries the commit) and two at TP>1
(prepare, then commit). Figures are wall time in the coordinator, so they include the sockets,
JSON, the worker's Python and its device calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from workbench.core.geometry import KVGeometry


def measure(tp: int, *, pages: int = 32, repeats: int = 5, layers: int = 2,
            backend: str = "sim", gpus: list[int] | None = None) -> dict[str, Any]:
    from workbench.transport.client import WorkerGroup

    geo = KVGeometry(num_layers=layers, kv_heads=8, head_dim=128, block_size=16,
                     num_blocks=pages * 64)
    ids = list(range(min(pages, geo.num_pages)))
    with WorkerGroup(geo, tp=tp, name=f"bench-tp{tp}", backend=backend, gpus=gpus) as g:
        fan = g.space(timeout=60.0)
        fan.map_page(ids[0])  # warm: connections, imports, first device calls (a GPU keeps a
        fan.unmap_page(ids[0])  # zero piece of the page's size after its first unmap)
        fan.ping()
        free0 = fan.device.mem_info().free
        maps, unmaps = [], []
        trips0 = fan.round_trips
        for _ in range(repeats):
            for p in ids:
                t = time.perf_counter()
                fan.map_page(p)
                maps.append(time.perf_counter() - t)
            for p in ids:
                t = time.perf_counter()
                fan.unmap_page(p)
                unmaps.append(time.perf_counter() - t)
        trips = (fan.round_trips - trips0) / (len(ids) * repeats)
        fan.ping()
        free1 = fan.device.mem_info().free
    us = 1e6
    return {
        "tp": tp, "backend": backend, "page_id_bytes": geo.page_id_bytes, "samples": len(maps),
        "map_us_median": statistics.median(maps) * us,
        "map_us_p90": sorted(maps)[int(0.9 * len(maps))] * us,
        "unmap_us_median": statistics.median(unmaps) * us,
        "unmap_us_p90": sorted(unmaps)[int(0.9 * len(unmaps))] * us,
        "round_trips_per_map_unmap": trips,
        "device_free_returned": free1 == free0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.bench.transport",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--pages", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--backend", choices=["sim", "host", "gpu"], default="sim")
    ap.add_argument("--gpus", type=int, nargs="*", default=None,
                    help="GPU index per rank (round robin); default: inherit")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [measure(tp, pages=a.pages, repeats=a.repeats, layers=a.layers, backend=a.backend,
                    gpus=a.gpus) for tp in a.tp]
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'tp':>3} {'backend':>7} {'map med us':>11} {'map p90':>8} {'unmap med us':>13} "
              f"{'unmap p90':>9} {'trips/map+unmap':>16} {'mem back':>8}")
        for r in rows:
            print(f"{r['tp']:>3} {r['backend']:>7} {r['map_us_median']:>11.1f} "
                  f"{r['map_us_p90']:>8.1f} {r['unmap_us_median']:>13.1f} "
                  f"{r['unmap_us_p90']:>9.1f} {r['round_trips_per_map_unmap']:>16.1f} "
                  f"{str(r['device_free_returned']):>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
