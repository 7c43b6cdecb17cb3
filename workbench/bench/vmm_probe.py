"""Why the workbench's driver calls cost more than the same calls issued bare (a GPU diagnostic).

``python -m workbench.bench.vmm_probe [out.json]`` runs ``bench vmm``'s grow/shrink with extra
subjects, interleaved page id by page id, each pulling one candidate cause apart from the others:

* ``*_t``: the subject over a driver proxy that times every hot call, so the *driver* time
  inside the workbench is compared with the same call's time when issued bare;
* ``raw_g1``/``wb_g1``: reservations aligned at 1 GiB instead of the 2 MiB granularity;
* ``raw_p0``: the raw subject with page id 0 mapped for good, as the workbench's null block is;
* ``batch``: ``CudaDevice``'s batched calls alone (no ledger, no page allocator);
* ``raw_py``: the raw calls right after the core's Python over the simulated device (does the
  Python in between slow the driver?), to set against ``raw`` plus ``sim``;
* a second pass with each subject alone (not interleaved), and a third with the GC disabled.

What it found on an H200 (2026-12-01, contiguous, 128 MiB page ids): every driver call took as
long inside the workbench as bare (create 29, map 2.6, set-access 36, unmap 25, release 82 µs);
1 GiB alignment, a page 0 kept mapped and the GC moved nothing beyond the noise; interleaving
slowed both sides alike. The gap was the workbench's own Python (that host ran it 2.5-3.5x
slower than a desktop core) and, with the zero page, a release ~25 µs slower when it came right
after the zero piece's set-access (now released first, as the bare calls do).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from workbench.bench.vmm import _abab, _Raw, _Workbench, model_geometry
from workbench.core.geometry import Layout
from workbench.gpu.device import CudaDevice
from workbench.gpu.driver import call, driver, use_driver
from workbench.outfiles import check, run_main, write_text
from workbench.sim.device import SimDevice
from workbench.strictjson import dumps
from workbench.units import GiB

HOT = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
       "cuMemGetInfo", "cuMemAddressReserve")


class TimedDriver:
    """The real driver module, with each hot call's wall time recorded per call name."""

    def __init__(self, real: Any):
        self._real = real
        self.log: dict[str, list[float]] = {n: [] for n in HOT}
        for name in HOT:
            setattr(self, name, self._wrap(getattr(real, name), self.log[name]))

    @staticmethod
    def _wrap(fn: Callable, log: list[float]) -> Callable:
        clock = time.perf_counter

        def timed(*a: Any) -> Any:
            t0 = clock()
            r = fn(*a)
            log.append(clock() - t0)
            return r
        return timed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _aligned(dev: CudaDevice, align: int) -> CudaDevice:
    """Make ``dev.reserve`` align its reservations at ``align`` (no zero page devices only)."""
    def reserve(size: int) -> int:
        va = int(call("reserve", dev._cu.cuMemAddressReserve, size, align, 0, 0))
        dev.reservations[va] = size
        return va
    dev.reserve = reserve  # type: ignore[method-assign]
    return dev


class _RawAligned(_Raw):
    def __init__(self, dev: CudaDevice, geo: Any, pages: int, align: int, page0: bool = False):
        super().__init__(dev, geo, pages, zero=False)
        cu = self.cu
        cu.cuMemAddressFree(self.base, self.size)
        self.base = int(call("reserve", cu.cuMemAddressReserve, self.size, align, 0, 0))
        if page0:  # page id 0 stays mapped, as the workbench's null block's page does
            self.grow(0)


class _Batch:
    """``CudaDevice.map_targets``/``unmap_targets``/``release_handles`` at the raw's targets."""

    def __init__(self, dev: CudaDevice, geo: Any, pages: int):
        self.dev, self.geo = dev, geo
        self.size = geo.page_id_bytes * pages
        self.base = dev.reserve(self.size)
        self.raw = _Raw.__new__(_Raw)
        self.raw.geo, self.raw.base, self.raw.n = geo, self.base, geo.maps_per_page
        self.hs: dict[int, list[int]] = {}

    def grow(self, page: int) -> None:
        t = [(va, self.geo.page_id_bytes // self.geo.maps_per_page)
             for va in self.raw._targets(page)]
        self.hs[page] = self.dev.map_targets(t)

    def shrink(self, page: int) -> None:
        t = [(va, self.geo.page_id_bytes // self.geo.maps_per_page)
             for va in self.raw._targets(page)]
        self.dev.unmap_targets(t)
        self.dev.release_handles(self.hs.pop(page))

    def close(self) -> None:
        for p in list(self.hs):
            self.shrink(p)
        self.dev.unreserve(self.base, self.size)


class _Pair:
    """``first`` then ``second`` in one timed step (the Python-before-driver subject)."""

    def __init__(self, first: Any, second: Any):
        self.first, self.second = first, second

    def grow(self, page: int) -> None:
        self.first.grow(page)
        self.second.grow(page)

    def shrink(self, page: int) -> None:
        self.first.shrink(page)
        self.second.shrink(page)

    def close(self) -> None:
        self.first.close()
        self.second.close()


def _med_us(rounds: list[list[float]]) -> float:
    return statistics.median(x for r in rounds for x in r) * 1e6


def _pass(subjects: dict[str, Any], pages: int, rounds: int, alone: bool) -> dict:
    if not alone:
        res = _abab(subjects, pages, rounds)
    else:
        res = {}
        for k, s in subjects.items():
            res.update(_abab({k: s}, pages, rounds))
    return {k: {"grow_us": _med_us(v["grow"]), "shrink_us": _med_us(v["shrink"])}
            for k, v in res.items()}


def _measure(layout: Layout, subjects: dict[str, Any], timed: dict[str, TimedDriver],
             pages: int, rounds: int) -> dict:
    """Warm every subject up, then the three passes and the timed driver calls' medians."""
    for s in subjects.values():  # warm-up
        for p in range(1, pages + 2):
            s.grow(p)
        for p in range(1, pages + 2):
            s.shrink(p)
    for t in timed.values():
        for v in t.log.values():
            v.clear()
    bases = {k: f"{(getattr(s, 'base', None) or s.kv.space.base) % GiB >> 20} MiB"
             for k, s in subjects.items() if k not in ("sim", "raw_py")}
    out: dict[str, Any] = {"layout": layout.value, "base_mod_1GiB": bases}
    out["interleaved"] = _pass(subjects, pages, rounds, alone=False)
    calls = {k: {n: round(statistics.median(v) * 1e6, 2) for n, v in t.log.items() if v}
             | {f"{n}_n": len(v) for n, v in t.log.items() if v}
             for k, t in timed.items()}
    out["driver_call_us"] = calls
    few = {k: subjects[k] for k in ("raw", "wb", "raw_t", "wb_t") if k in subjects}
    out["alone"] = _pass(few, pages, rounds, alone=True)
    gc.disable()
    try:
        out["interleaved_nogc"] = _pass(few, pages, rounds, alone=False)
    finally:
        gc.enable()
    return out


def probe(layout: Layout, pages: int = 40, rounds: int = 10) -> dict:
    geo = model_geometry(layout, pages + 2)
    real = driver()
    devs: list[CudaDevice] = []
    subjects: dict[str, Any] = {}
    timed: dict[str, TimedDriver] = {}

    def dev(zero: bool = False, timer: str | None = None) -> CudaDevice:
        if timer is None:
            d = CudaDevice(0, zero_page=zero)
        else:
            timed[timer] = TimedDriver(real)
            with use_driver(timed[timer]):
                d = CudaDevice(0, zero_page=zero)
        devs.append(d)
        return d

    def raw(timer: str | None = None, zero: bool = False) -> _Raw:
        if timer is None:
            return _Raw(dev(zero), geo, pages + 2, zero)
        d = dev(zero, timer)
        with use_driver(timed[timer]):
            return _Raw(d, geo, pages + 2, zero)

    contiguous = layout is Layout.CONTIGUOUS
    try:
        subjects["raw"] = raw()
        subjects["wb"] = _Workbench(dev(), geo)
        subjects["raw_t"] = raw("raw_t")
        subjects["wb_t"] = _Workbench(dev(timer="wb_t"), geo)
        subjects["raw_zero_t"] = raw("raw_zero_t", zero=True)
        subjects["wb_zero_t"] = _Workbench(dev(True, "wb_zero_t"), geo)
        if contiguous:
            subjects["raw_g1"] = _RawAligned(dev(), geo, pages + 2, GiB)
            subjects["wb_g1"] = _Workbench(_aligned(dev(), GiB), geo)
            d0 = dev()
            subjects["raw_p0"] = _RawAligned(d0, geo, pages + 2, d0.granularity, True)
            subjects["batch"] = _Batch(dev(), geo, pages + 2)
            subjects["sim"] = _Workbench(SimDevice("h200"), geo)
            subjects["raw_py"] = _Pair(_Workbench(SimDevice("h200"), geo), raw())
        return _measure(layout, subjects, timed, pages, rounds)
    finally:
        for s in subjects.values():
            s.close()
        for d in devs:
            d.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench.bench.vmm_probe [OUT.json]``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        check(argv[0], "OUT")  # before the run
    out = {lay.value: probe(lay, rounds=10 if lay is Layout.CONTIGUOUS else 4)
           for lay in (Layout.CONTIGUOUS, Layout.PER_LAYER)}
    for lay, r in out.items():
        print(f"== {lay}  bases mod 1 GiB: {r['base_mod_1GiB']}")
        for phase in ("interleaved", "alone", "interleaved_nogc"):
            for k, v in r[phase].items():
                print(f"{phase:<17} {k:<11} grow {v['grow_us']:9.1f}  shrink {v['shrink_us']:9.1f}")
        for k, v in r["driver_call_us"].items():
            print(f"driver calls {k:<11} " + "  ".join(f"{n}={x}" for n, x in v.items()))
    if argv:
        write_text(argv[0], dumps(out, indent=1), "OUT")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
