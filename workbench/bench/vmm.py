"""``workbench bench vmm``: what elastic KV costs on a real GPU, measured against the raw driver.

1. **Grow / shrink per page id**, steady state after one warm-up pass, through the workbench
   (``KVCacheManager.alloc`` of exactly one page id's blocks, prealloc off, no reserve pool, so
   every alloc maps and every free unmaps) against the same driver calls issued bare
   (create+map+set_access / unmap+release), timed in the same run, interleaved in rounds;
   medians. With the zero page on, the workbench also swaps the zero pieces (an unmap on grow,
   a map and a set_access on shrink, per target), so it is also compared with bare calls that
   do the same swap.
2. **Map cost per page id** for a 32-layer model: CONTIGUOUS (one compound map) vs PER_LAYER
   (``2 * layers`` maps): that is (1) run for both layouts.
3. **Bandwidth**: a read (sum) and a read-write (in-place add) over the whole KV, VMM-backed (both
   layouts) vs one plain ``torch.empty`` of the same size; CUDA events, medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.gpu.device import CudaDevice
from workbench.gpu.driver import call, driver
from workbench.sim.device import SimDevice

MiB, GiB = 1 << 20, 1 << 30


def model_geometry(layout: Layout, num_pages: int, num_layers: int = 32) -> KVGeometry:
    """A Llama-3-8B-like KV: 32 layers, 8 KV heads x 128, bf16, 16-token blocks (32 KiB)."""
    return KVGeometry(num_layers=num_layers, kv_heads=8, head_dim=128, block_size=16,
                      num_blocks=64 * num_pages, layout=layout)


def _median_us(xs: list[float]) -> float:
    return statistics.median(xs) * 1e6


# -- 1 & 2: grow / shrink ----------------------------------------------------------------------
class _Raw:
    """Bare driver calls over one page id's targets (no Python layer above ``cuda.bindings``)."""

    def __init__(self, dev: CudaDevice, geo: KVGeometry, pages: int, zero: bool):
        self.cu, self.dev, self.geo, self.zero = driver(), dev, geo, zero
        self.g = dev.granularity
        self.size = geo.page_id_bytes * pages
        self.base = int(call("reserve", self.cu.cuMemAddressReserve, self.size, self.g, 0, 0))
        self.n = geo.maps_per_page
        self.tsize = geo.page_id_bytes // self.n
        self.zh = None
        if zero:  # the ideal zero page: one piece per target, laid out in advance
            self.zh = call("create", self.cu.cuMemCreate, self.tsize, dev._prop, 0)
            for page in range(pages):
                for va in self._targets(page):
                    call("map", self.cu.cuMemMap, va, self.tsize, 0, self.zh, 0)
            call("set_access", self.cu.cuMemSetAccess, self.base, self.size, self._zdesc(), 1)
        self.handles: dict[int, list[Any]] = {}

    def _zdesc(self) -> list[Any]:
        return self.dev._ro if self.dev.zero_access == "read" else self.dev._rw

    def _targets(self, page: int) -> list[int]:
        g = self.geo
        if g.layout is Layout.CONTIGUOUS:
            return [self.base + page * g.page_id_bytes]
        region = g.num_pages * g.page_size
        return [self.base + i * region + page * g.page_size for i in range(self.n)]

    def grow(self, page: int) -> None:
        cu, s, prop, rw = self.cu, self.tsize, self.dev._prop, self.dev._rw
        hs = []
        for va in self._targets(page):
            if self.zero:
                cu.cuMemUnmap(va, s)
            err, h = cu.cuMemCreate(s, prop, 0)
            cu.cuMemMap(va, s, 0, h, 0)
            cu.cuMemSetAccess(va, s, rw, 1)
            hs.append(h)
        self.handles[page] = hs

    def shrink(self, page: int) -> None:
        cu, s = self.cu, self.tsize
        for va, h in zip(self._targets(page), self.handles.pop(page), strict=True):
            cu.cuMemUnmap(va, s)
            cu.cuMemRelease(h)
            if self.zero:
                cu.cuMemMap(va, s, 0, self.zh, 0)
                cu.cuMemSetAccess(va, s, self._zdesc(), 1)

    def close(self) -> None:
        for page in list(self.handles):
            self.shrink(page)
        if self.zero:
            self.cu.cuMemUnmap(self.base, self.size)
            self.cu.cuMemRelease(self.zh)
        self.cu.cuMemAddressFree(self.base, self.size)


class _Workbench:
    """One page id per alloc through the ledger: page 0's spare blocks are taken first."""

    def __init__(self, dev: CudaDevice, geo: KVGeometry):
        cfg = PoolConfig(contiguous_layout=geo.layout is Layout.CONTIGUOUS, prealloc=False,
                         min_reserved_pages=0, max_reserved_pages=0)
        self.kv = KVCacheManager(geo, dev, name="bench", config=cfg)
        self.bpp = geo.page_size // geo.block_bytes
        self.filler = self.kv.alloc(self.bpp - 1)  # the rest of the null block's page
        self.ids: dict[int, list[int]] = {}

    def grow(self, page: int) -> None:
        ids = self.kv.alloc(self.bpp)
        if ids is None:
            raise RuntimeError("the bench pool ran out of device memory")
        self.ids[page] = ids

    def shrink(self, page: int) -> None:
        self.kv.free(self.ids.pop(page))

    def close(self) -> None:
        for page in list(self.ids):
            self.shrink(page)
        self.kv.free(self.filler)
        self.kv.close()


def _timed_rounds(subjects: dict[str, Any], pages: int, rounds: int) -> dict[str, dict]:
    """Interleave the subjects round by round; time each grow and each shrink on its own."""
    tg: dict[str, list[float]] = {k: [] for k in subjects}
    ts: dict[str, list[float]] = {k: [] for k in subjects}
    per = max(1, pages // rounds)
    clock = time.perf_counter
    for r in range(rounds):
        for name, s in subjects.items():
            for p in range(r * per + 1, (r + 1) * per + 1):
                t0 = clock()
                s.grow(p)
                tg[name].append(clock() - t0)
        for name, s in subjects.items():
            for p in range(r * per + 1, (r + 1) * per + 1):
                t0 = clock()
                s.shrink(p)
                ts[name].append(clock() - t0)
    return {k: {"grow_us": _median_us(tg[k]), "shrink_us": _median_us(ts[k]), "n": len(tg[k])}
            for k in subjects}


def grow_shrink(layout: Layout, pages: int = 40, rounds: int = 4,
                num_layers: int = 32) -> dict:
    geo = model_geometry(layout, pages + 2, num_layers)
    dev_z = CudaDevice(0, zero_page=True)
    dev_n = CudaDevice(0, zero_page=False)
    subjects: dict[str, Any] = {}
    try:
        subjects["workbench_zero"] = _Workbench(dev_z, geo)
        subjects["workbench_nozero"] = _Workbench(dev_n, geo)
        subjects["raw"] = _Raw(dev_n, geo, pages + 2, zero=False)
        subjects["raw_zero"] = _Raw(dev_z, geo, pages + 2, zero=True)
        # the core's own Python cost on this host: the same ledger over the simulated device
        subjects["core_on_sim"] = _Workbench(SimDevice("h200"), geo)
        for s in subjects.values():  # warm-up: one-off driver costs, and zero pieces settle
            for p in range(1, pages + 2):
                s.grow(p)
            for p in range(1, pages + 2):
                s.shrink(p)
        res = _timed_rounds(subjects, pages, rounds)
    finally:
        for s in subjects.values():
            s.close()
        dev_z.close()
        dev_n.close()
    out = {
        "layout": layout.value, "num_layers": num_layers, "page_id_bytes": geo.page_id_bytes,
        "maps_per_page_id": geo.maps_per_page, "pages_timed": res["raw"]["n"], **res,
        "ratio_grow_vs_raw": res["workbench_nozero"]["grow_us"] / res["raw"]["grow_us"],
        "ratio_shrink_vs_raw": res["workbench_nozero"]["shrink_us"] / res["raw"]["shrink_us"],
        "ratio_grow_zero_vs_raw_zero":
            res["workbench_zero"]["grow_us"] / res["raw_zero"]["grow_us"],
        "ratio_shrink_zero_vs_raw_zero":
            res["workbench_zero"]["shrink_us"] / res["raw_zero"]["shrink_us"],
        "ratio_grow_zero_vs_raw": res["workbench_zero"]["grow_us"] / res["raw"]["grow_us"],
        "ratio_shrink_zero_vs_raw": res["workbench_zero"]["shrink_us"] / res["raw"]["shrink_us"],
    }
    return out


def reserve_cost(gib: int = 16) -> dict:
    """What the zero page costs a reservation, and what one cuMemGetInfo costs."""
    out: dict[str, float] = {}
    for zero in (False, True):
        dev = CudaDevice(0, zero_page=zero)
        try:
            dev.reserve(dev.granularity)  # the zero chunk is made on the first reserve
            t0 = time.perf_counter()
            va = dev.reserve(gib * GiB)
            out[f"reserve_ms_per_gib_{'zero' if zero else 'nozero'}"] = (
                (time.perf_counter() - t0) * 1e3 / gib)
            dev.unreserve(va, gib * GiB)
        finally:
            dev.close()
    cu = driver()
    ts = []
    for _ in range(200):
        t0 = time.perf_counter()
        cu.cuMemGetInfo()
        ts.append(time.perf_counter() - t0)
    out["cuMemGetInfo_us"] = _median_us(ts)
    return out


# -- 3: bandwidth ------------------------------------------------------------------------------
def _time_cuda(fn: Callable[[], Any], reps: int = 20, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def bandwidth(gib: int = 4) -> dict:
    import torch

    from workbench.gpu.tensors import KVTensors

    pages = gib * GiB // (128 * MiB)
    results: dict[str, Any] = {"bytes": pages * 128 * MiB}

    def measure(name: str, t: torch.Tensor) -> None:
        x = t.view(torch.float32)
        g = torch.Generator(device=x.device).manual_seed(1)
        x.uniform_(-1, 1, generator=g)
        n = x.numel() * 4
        s = _time_cuda(lambda: x.sum())
        w = _time_cuda(lambda: x.add_(1e-3))
        results[name] = {"sum_TBps": n / s / 1e12, "add_TBps": 2 * n / w / 1e12,
                         "sum_ms": s * 1e3, "add_ms": w * 1e3}

    plain = torch.empty(pages * 128 * MiB, dtype=torch.uint8, device="cuda")
    measure("plain", plain)
    del plain
    torch.cuda.empty_cache()
    for layout in (Layout.CONTIGUOUS, Layout.PER_LAYER):
        dev = CudaDevice(0)
        geo = model_geometry(layout, pages)
        cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, prealloc=False)
        kv = KVCacheManager(geo, dev, name="bw", config=cfg)
        try:
            ids = kv.alloc(geo.num_blocks - 1)  # every page mapped
            assert ids is not None and kv.space.size == results["bytes"]
            kvt = KVTensors(kv.space, "bf16")
            measure(f"vmm_{layout.value}", kvt.raw)
            del kvt
            torch.cuda.synchronize()
            kv.free(ids)
        finally:
            kv.close()
            dev.close()
    p = results["plain"]
    for layout in ("contiguous", "per_layer"):
        v = results[f"vmm_{layout}"]
        results[f"ratio_sum_{layout}"] = v["sum_TBps"] / p["sum_TBps"]
        results[f"ratio_add_{layout}"] = v["add_TBps"] / p["add_TBps"]
    return results


def run_vmm(pages: int = 40, rounds: int = 4, bw_gib: int = 4, with_bandwidth: bool = True,
            progress: Callable[[str], None] | None = None) -> dict:
    """Every figure of ``workbench bench vmm`` in one dict."""
    say = progress or (lambda _msg: None)
    dev = CudaDevice(0)
    out: dict[str, Any] = {"device": dev.name, "granularity": dev.granularity}
    dev.reserve(dev.granularity)
    out["zero_access"] = dev.zero_access
    dev.close()
    say("grow/shrink, contiguous")
    out["contiguous"] = grow_shrink(Layout.CONTIGUOUS, pages, rounds)
    say("grow/shrink, per-layer")
    out["per_layer"] = grow_shrink(Layout.PER_LAYER, pages, rounds)
    out["map_cost_per_page_id_us"] = {
        "contiguous": out["contiguous"]["workbench_nozero"]["grow_us"],
        "per_layer": out["per_layer"]["workbench_nozero"]["grow_us"]}
    say("reserve and mem_info cost")
    out["reserve"] = reserve_cost()
    if with_bandwidth:
        say("bandwidth")
        out["bandwidth"] = bandwidth(bw_gib)
    out["goals"] = {
        "grow_shrink_ratio_max": 1.15, "bandwidth_ratio_min": 0.98,
        "grow_shrink_ratio_worst_nozero": max(
            out[lay][k] for lay in ("contiguous", "per_layer")
            for k in ("ratio_grow_vs_raw", "ratio_shrink_vs_raw")),
        "grow_shrink_ratio_worst_zero_vs_raw_zero": max(
            out[lay][k] for lay in ("contiguous", "per_layer")
            for k in ("ratio_grow_zero_vs_raw_zero", "ratio_shrink_zero_vs_raw_zero")),
    }
    if with_bandwidth:
        b = out["bandwidth"]
        out["goals"]["bandwidth_ratio_worst"] = min(
            b[f"ratio_{k}_{lay}"] for k in ("sum", "add") for lay in ("contiguous", "per_layer"))
    return out
