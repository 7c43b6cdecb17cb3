"""``workbench bench vmm``: what elastic KV costs on a real GPU, measured against the raw driver.

1. **Grow / shrink per page id**, steady state after one warm-up pass, through the workbench
   (``KVCacheManager.alloc`` of exactly one page id's blocks, prealloc off, no reserve pool, so
   every alloc maps and every free unmaps) against the same driver calls issued bare
   (create+map+set_access / unmap+release). The subjects are interleaved page id by page id
   (A B C ..., the order reversed every round), ``rounds`` times; each ratio is reported as the
   median, p10 and p90 of its per-round ratios. With the zero page on, the workbench also swaps
   the zero pieces (an unmap on grow, a map and a set_access on shrink, per target), so it is
   also compared with bare calls that do the same swap. Both layouts: CONTIGUOUS (one compound
   map per page id) and PER_LAYER (``2 * layers`` maps). Where the C fast path loads
   (:mod:`workbench.gpu.fastcalls`), the bare calls are also issued from C in one call each way
   (``raw_c``: what is left is the workbench's own Python), and the workbench on its Python
   batch is timed beside the C one (``_py``), all in the same interleaved run.
2. **Alloc latency with a warm reserve** (:func:`warm_alloc`): the request path of ``alloc`` when
   the reserve refills inline, when it is refilled off the request path, and with no reserve.
3. **Bandwidth**, like for like (:mod:`workbench.bench.vmm_bw`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from workbench.bench.params import check
from workbench.bench.stats import nearest_deciles
from workbench.bench.vmm_bw import GOAL_BANDWIDTH, bandwidth
from workbench.bench.vmm_bw import summary_lines as bw_lines
from workbench.bench.vmm_raw import _Raw, model_geometry, raw_subjects  # noqa: F401 - _Raw: vmm_probe, tests
from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.gpu.device import CudaDevice
from workbench.gpu.driver import driver
from workbench.mini.mapper import BackgroundMapper, LockedKVCacheManager
from workbench.sim.device import SimDevice
from workbench.units import GiB

GOAL_RATIO = 1.10  # workbench / raw driver, per page id (issue: a fast path to the driver)
WARM_MODES = ("inline", "deferred", "mapper", "cold")


def _median_us(xs: list[float]) -> float:
    return statistics.median(xs) * 1e6


# -- 1 & 2: grow / shrink ----------------------------------------------------------------------
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


def _abab(subjects: dict[str, Any], pages: int, rounds: int) -> dict[str, dict]:
    """Grow page ids 1..pages, then shrink them, each page id through every subject in turn
    (A B C... per page id, the order reversed every round), so the samples a ratio compares are
    taken moments apart. Returns every subject's per-round grow and shrink times (seconds)."""
    names = list(subjects)
    tg: dict[str, list[list[float]]] = {k: [] for k in names}
    ts: dict[str, list[list[float]]] = {k: [] for k in names}
    clock = time.perf_counter
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for k in names:
            tg[k].append([])
            ts[k].append([])
        for p in range(1, pages + 1):
            for k in order:
                t0 = clock()
                subjects[k].grow(p)
                tg[k][-1].append(clock() - t0)
        for p in range(1, pages + 1):
            for k in order:
                t0 = clock()
                subjects[k].shrink(p)
                ts[k][-1].append(clock() - t0)
    return {k: {"grow": tg[k], "shrink": ts[k]} for k in names}


# (numerator, denominator) subjects of each reported ratio. "raw" is the baseline, the
# bare calls from Python; the "_c" pairs compare with the same calls from C in one call (where
# the fast path's library loads), what the workbench's own Python costs beyond the driver
PAIRS = {"nozero": ("workbench_nozero", "raw"), "zero": ("workbench_zero", "raw_zero"),
         "zero_vs_raw": ("workbench_zero", "raw"), "nozero_c": ("workbench_nozero", "raw_c"),
         "zero_c": ("workbench_zero", "raw_zero_c"),
         # the workbench on its Python batch (fast_path=False), in the same interleaved run
         "nozero_py": ("workbench_nozero_py", "raw"), "zero_py": ("workbench_zero_py", "raw_zero")}


def _summarize(raw: dict[str, dict], rounds: int) -> dict:
    out: dict[str, Any] = {}
    for k, v in raw.items():
        out[k] = {f"{kind}_us": _median_us([x for rnd in v[kind] for x in rnd])
                  for kind in ("grow", "shrink")}
        out[k]["n"] = sum(len(rnd) for rnd in v["grow"])
    for pair, (a, b) in PAIRS.items():
        if a not in raw or b not in raw:
            continue
        for kind in ("grow", "shrink"):
            per_round = [statistics.median(raw[a][kind][r]) / statistics.median(raw[b][kind][r])
                         for r in range(rounds)]
            out[f"ratio_{kind}_{pair}"] = {
                **nearest_deciles(per_round),
                "of_medians": out[a][f"{kind}_us"] / out[b][f"{kind}_us"]}
    return out


def grow_shrink(layout: Layout, pages: int = 40, rounds: int = 10,
                num_layers: int = 32) -> dict:
    """Per-page-id grow and shrink of every subject, interleaved, ``rounds`` times: medians,
    and each workbench/raw ratio as the median, p10 and p90 of its per-round ratios."""
    geo = model_geometry(layout, pages + 2, num_layers)
    devs = [CudaDevice(0, zero_page=True), CudaDevice(0, zero_page=False)]
    dev_z, dev_n = devs
    subjects: dict[str, Any] = {}
    try:
        subjects["workbench_zero"] = _Workbench(dev_z, geo)
        subjects["workbench_nozero"] = _Workbench(dev_n, geo)
        if dev_n._fast is not None:  # the C fast path is on: the Python batch beside it
            devs += [CudaDevice(0, zero_page=z, fast_path=False) for z in (True, False)]
            subjects["workbench_zero_py"] = _Workbench(devs[2], geo)
            subjects["workbench_nozero_py"] = _Workbench(devs[3], geo)
        subjects.update(raw_subjects(dev_n, dev_z, geo, pages + 2))
        # the core's own Python cost on this host: the same ledger over the simulated device
        subjects["core_on_sim"] = _Workbench(SimDevice("h200"), geo)
        for s in subjects.values():  # warm-up: one-off driver costs, and zero pieces settle
            for p in range(1, pages + 2):
                s.grow(p)
            for p in range(1, pages + 2):
                s.shrink(p)
        res = _summarize(_abab(subjects, pages, rounds), rounds)
    finally:
        for s in subjects.values():
            s.close()
        for d in devs:
            d.close()
    return {"layout": layout.value, "num_layers": num_layers, "page_id_bytes": geo.page_id_bytes,
            "maps_per_page_id": geo.maps_per_page, "rounds": rounds,
            "pages_timed": res["raw"]["n"], **res}


def warm_alloc(layout: Layout = Layout.CONTIGUOUS, per_cycle: int = 40, cycles: int = 5,
               gap_s: float = 0.0005) -> dict:
    """Request-path latency of ``alloc`` (one page id's blocks) while the reserve is warm.

    Each cycle allocates ``per_cycle`` page ids one by one (timed), then frees them (untimed).
    ``inline``: the default pool, whose alloc refills the reserve on the spot when it drops below
    ``min_reserved`` (a map on the request path). ``deferred``: the refill runs between requests
    on the same thread, so an alloc only takes an already-mapped page. ``mapper``: the refill runs
    on a background thread (:mod:`workbench.mini.mapper`, the alloc takes its lock), the next
    request waiting until the reserve is full again. ``cold``: no reserve, every alloc maps.
    Every mode leaves ``gap_s`` between requests (after any refill), as arrivals would, so no
    mode is timed hot against one timed after a pause."""
    geo = model_geometry(layout, per_cycle + 16)
    bpp = geo.page_size // geo.block_bytes
    out: dict[str, Any] = {"layout": layout.value}
    for mode in WARM_MODES:
        dev = CudaDevice(0)
        cold = mode == "cold"
        cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, prealloc=not cold,
                         min_reserved_pages=0 if cold else 5,
                         max_reserved_pages=0 if cold else 10)
        kv = (LockedKVCacheManager if mode == "mapper" else KVCacheManager)(
            geo, dev, name="warm", config=cfg)
        mapper = BackgroundMapper(kv) if mode == "mapper" else None
        try:
            if mode == "deferred":
                kv.pages.refill_hook = lambda: None  # signal only; refilled below, untimed
            filler = kv.alloc(bpp - 1)  # the rest of the null block's page
            ts: list[float] = []
            for _ in range(cycles):
                kv.pages.refill()
                held = []
                for _ in range(per_cycle):
                    t0 = time.perf_counter()
                    held.append(kv.alloc(bpp))
                    ts.append(time.perf_counter() - t0)
                    if mode == "deferred":
                        kv.pages.refill()
                    elif mapper is not None:
                        mapper.wait_filled()  # requests spaced wider than one page's map
                    time.sleep(gap_s)
                for ids in held:
                    kv.free(ids)
            kv.free(filler)
            out[mode] = {k: v * 1e6 for k, v in nearest_deciles(ts).items() if k != "n"}
            out[mode]["n"] = len(ts)
        finally:
            if mapper is not None:
                mapper.stop()
            kv.close()
            dev.close()
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


def run_vmm(pages: int = 40, rounds: int = 10, bw_gib: int = 4, with_bandwidth: bool = True,
            bw_repeats: int = 10, progress: Callable[[str], None] | None = None) -> dict:
    """Every figure of ``workbench bench vmm`` in one dict."""
    check("vmm", pages=pages, rounds=rounds, bw_gib=bw_gib, bw_repeats=bw_repeats)
    say = progress or (lambda _msg: None)
    dev = CudaDevice(0)
    out: dict[str, Any] = {"device": dev.name, "granularity": dev.granularity,
                           "fast_path": dev.fast_path_note}
    dev.reserve(dev.granularity)
    out["zero_access"] = dev.zero_access
    dev.close()
    for layout in (Layout.CONTIGUOUS, Layout.PER_LAYER):
        say(f"grow/shrink, {layout.value}, {rounds} interleaved rounds")
        out[layout.value] = grow_shrink(layout, pages, rounds)
    out["map_cost_per_page_id_us"] = {
        lay: out[lay]["workbench_nozero"]["grow_us"] for lay in ("contiguous", "per_layer")}
    say("alloc latency with a warm reserve")
    out["warm_alloc"] = {lay.value: warm_alloc(lay) for lay in (Layout.CONTIGUOUS,
                                                                 Layout.PER_LAYER)}
    say("reserve and mem_info cost")
    out["reserve"] = reserve_cost()
    out["goals"] = {
        "grow_shrink_ratio_max": GOAL_RATIO, "bandwidth_ratio_min": GOAL_BANDWIDTH,
        "grow_shrink_ratio_worst_nozero": max(
            out[lay][f"ratio_{k}_nozero"]["median"] for lay in ("contiguous", "per_layer")
            for k in ("grow", "shrink")),
        "grow_shrink_ratio_worst_zero_vs_raw_zero": max(
            out[lay][f"ratio_{k}_zero"]["median"] for lay in ("contiguous", "per_layer")
            for k in ("grow", "shrink")),
    }
    if with_bandwidth:
        say(f"bandwidth, like for like, {bw_repeats} repeats")
        out["bandwidth"] = bandwidth(bw_gib, bw_repeats)
        out["goals"]["bandwidth_ratio_worst"] = min(
            r["ratio"]["median"] for r in out["bandwidth"]["pairings"].values())
    return out


def summary_lines(res: dict) -> list[str]:
    """One line per measured pairing: the figures the issue asks for, medians with p10/p90."""
    lines = []
    for lay in ("contiguous", "per_layer"):
        r = res[lay]
        for pair in PAIRS:
            if f"ratio_grow_{pair}" not in r:
                continue
            for kind in ("grow", "shrink"):
                q = r[f"ratio_{kind}_{pair}"]
                a, b = PAIRS[pair]
                lines.append(
                    f"vmm {lay:<10} {kind:<6} {a}/{b}: median {q['median']:.3f} "
                    f"[p10 {q['p10']:.3f}, p90 {q['p90']:.3f}] over {q['n']} rounds; "
                    f"{r[a][f'{kind}_us']:.1f} vs {r[b][f'{kind}_us']:.1f} us")
    for lay, w in res.get("warm_alloc", {}).items():
        lines.append(f"alloc {lay:<10} warm reserve, request path: " + "; ".join(
            f"{m} p50 {w[m]['median']:.1f} us (p10 {w[m]['p10']:.1f}, p90 {w[m]['p90']:.1f})"
            for m in ("deferred", "mapper", "inline", "cold") if m in w))
    if "bandwidth" in res:
        lines += bw_lines(res["bandwidth"])
    lines.append(f"vmm C fast path: {res.get('fast_path', 'unknown')}")
    return lines
