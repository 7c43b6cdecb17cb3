"""Why per-layer in-place ``add_`` over VMM ran 0.97x plain on an H200 (a GPU diagnostic).

``python -m workbench.bench.vmm_bw_probe [--out probe.json]`` times the same kernels over the
same ``regions`` x ``pages * 2 MiB`` regions (one launch per region, 64 regions of a 32-layer
model) backed in different ways, every subject interleaved with the others in each repeat (the
order rotated, see :func:`~workbench.bench.vmm_bw_plan.rotation`):

* ``plain_each``: one ``torch.empty`` per region (the bench's plain side; one segment each);
* ``plain_packed``: one ``torch.empty`` cut into the regions (torch's placement, hypothesis b);
* ``wb``: the workbench's PER_LAYER pool (the bench's VMM side);
* ``wb_contig64``: a CONTIGUOUS pool (128 MiB mappings) cut into as many regions;
* ``wb_p8``: a PER_LAYER pool with 8 MiB pages (``page_size``, a configuration alone);
* the raw driver plans of :mod:`~workbench.bench.vmm_bw_plan` (hypothesis a).

Kernels: ``sum`` (read), ``add`` (in-place read-write), ``copy`` (the first half of the regions
into the second half) and ``fill`` (write only) (hypothesis c). Each repeat gives every subject's
median of ``reps`` event-timed runs and its first run after switching (hypothesis d); a ratio is
``t(plain_each) / t(subject)`` in one repeat. A sweep over the region size (hypothesis e) repeats
``sum`` and ``add`` at other sizes. Grow and shrink cost per page id is timed while the
page-major raw plans are built and torn down.

What it found on an H200 (2026-12-01, two runs, 64 x 64 MiB regions, ratios vs plain_each):
only writes lose, and the loss follows how each region's 2 MiB pieces were created, not how
many handles or maps there are. Page id by page id (the pool as it grows: ``wb`` and its bare
twin ``h2m_page``): ``add`` 0.970, ``copy`` 0.961, ``fill`` 0.983, ``sum`` 1.009. The same 2048
handles created region by region (``h2m_region``): 1.000, 0.991, 1.000, 1.004; one handle per
region: 1.000 throughout; shuffled: ``add`` 0.965; reversed: 0.996. So a write stream crossing
from one piece into one not physically next to it costs (inferred: the driver hands out
consecutive creates adjacently). Not the cause: launch count (``wb_contig64``, 64 launches over
128 MiB mappings, 1.000), torch's placement (``plain_packed`` 1.000), order or warm-up (before/
after the reference alike), TLB reach (``add`` 0.971, 0.970, 0.970 at 32, 64 and 256 MiB regions,
2 to 16 GiB). Larger pieces shrink the loss: 8 MiB pages (``wb_p8``) ``add`` 0.992, ``copy``
0.998; growing 8 page ids per batch region by region (``hbatch8``) 0.992 and 0.988. A mapping at
a non-zero offset into a handle (``hpage``, ``hregion_2m``) is refused (CUDA_ERROR_NOT_SUPPORTED).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from workbench.bench.stats import deciles
from workbench.bench.vmm_bw import _fill, _kernel, _vmm_pool
from workbench.bench.vmm_bw_plan import PIECE, Handle, check_plan, per_page, plan, rotation
from workbench.core.geometry import Layout
from workbench.errors import DeviceError
from workbench.gpu.driver import call, driver
from workbench.outfiles import check, run_main, write_text
from workbench.strictjson import dumps
from workbench.units import GiB

REGIONS = 64  # 32 layers x (K, V)
KERNELS = ("sum", "add", "copy", "fill")
# hpage and hregion_2m are left out: this H200's driver refuses a non-zero cuMemMap offset
MAIN = ("plain_each", "plain_packed", "wb", "wb_contig64", "wb_p8", "h2m_page", "h2m_region",
        "h2m_rev", "h2m_shuf", "hbatch8", "hchunk4", "hchunk8", "hregion")
SWEEP = ("plain_each", "h2m_page", "hchunk4", "hregion")
PAGE_MAJOR = ("h2m_page", "hbatch8", "hchunk4", "hchunk8")  # grow/shrink timed per page id
REF = "plain_each"


class RawBacking:
    """A reservation backed by a plan through bare driver calls; times each handle's
    create + maps + set-access, and at :meth:`close` its unmaps + release."""

    def __init__(self, handles: list[Handle], total: int, device: int = 0):
        check_plan(handles, total)
        from workbench.gpu.device import CudaDevice

        # a device with no zero page: it binds the primary context; its prop and access
        # descriptor are the ones the workbench maps with
        self.dev = CudaDevice(device, zero_page=False)
        cu = self.cu = driver()
        self.handles, self.total = handles, total
        self.prop, self.rw = self.dev._prop, self.dev._rw
        self.base = int(call("reserve", cu.cuMemAddressReserve, total, PIECE, 0, 0))
        self.made: list[tuple[Any, list]] = []  # (driver handle, its mappings), in order
        self.grow_s: list[float] = []
        try:
            for h in handles:
                self._grow(h)
        except DeviceError:
            self.close()
            raise

    def _grow(self, h: Handle) -> None:
        cu, t0 = self.cu, time.perf_counter()
        dh = call("create", cu.cuMemCreate, h.size, self.prop, 0)
        done: list[tuple[int, int]] = []  # what close() must unmap, should a later map fail
        self.made.append((dh, done))
        for va, size, off in h.maps:
            call("map", cu.cuMemMap, self.base + va, size, off, dh, 0)
            done.append((self.base + va, size))
            call("set_access", cu.cuMemSetAccess, self.base + va, size, self.rw, 1)
        self.grow_s.append(time.perf_counter() - t0)

    def close(self) -> list[float]:
        """Unmap and release everything (creation order); each handle's seconds."""
        cu, out = self.cu, []
        for dh, done in self.made:
            t0 = time.perf_counter()
            for va, size in done:
                call("unmap", cu.cuMemUnmap, va, size)
            call("release", cu.cuMemRelease, dh)
            out.append(time.perf_counter() - t0)
        self.made = []
        call("unreserve", cu.cuMemAddressFree, self.base, self.total)
        self.dev.close()
        return out


def _ext_kernel(kind: str, tensors: list) -> tuple[Any, int]:
    """``copy`` and ``fill`` beside :func:`vmm_bw._kernel`'s ``sum`` and ``add``."""
    import torch

    if kind in ("sum", "add"):
        return _kernel(kind, tensors)
    xs = [t.view(torch.float32) for t in tensors]
    nbytes = sum(x.numel() * 4 for x in xs)
    if kind == "fill":
        def run_fill() -> None:
            for x in xs:
                x.fill_(0.375)
        return run_fill, nbytes
    half = len(xs) // 2

    def run_copy() -> None:
        for src, dst in zip(xs[:half], xs[half:], strict=True):
            dst.copy_(src)
    return run_copy, 2 * sum(x.numel() * 4 for x in xs[:half])


def _times(fn: Any, reps: int, warmup: int = 2) -> tuple[float, float]:
    """(first run, median of ``reps`` after ``warmup``) in seconds, timed with CUDA events."""
    import torch

    def once() -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3

    first = once()
    for _ in range(warmup - 1):
        fn()
    return first, statistics.median(once() for _ in range(reps))


class Subjects:
    """Every subject's region tensors; what backs them, to give back at :meth:`close`."""

    def __init__(self) -> None:
        self.regions: dict[str, list] = {}
        self.raw: dict[str, RawBacking] = {}
        self.pools: list[tuple[Any, Any, Any]] = []
        self.skipped: dict[str, str] = {}
        self.segments: dict[str, int] = {}

    def build(self, name: str, pages: int) -> None:
        import torch

        from workbench.gpu.tensors import from_pointer

        region = pages * PIECE
        if name.startswith("plain"):
            before = torch.cuda.memory_stats().get("segment.all.current", 0)
            if name == "plain_each":
                ts = [torch.empty(region, dtype=torch.uint8, device="cuda")
                      for _ in range(REGIONS)]
            else:
                big = torch.empty(REGIONS * region, dtype=torch.uint8, device="cuda")
                ts = [big[i * region:(i + 1) * region] for i in range(REGIONS)]
            self.segments[name] = torch.cuda.memory_stats()["segment.all.current"] - before
        elif name.startswith("wb"):
            layout = Layout.CONTIGUOUS if name == "wb_contig64" else Layout.PER_LAYER
            dev, kv, ts, ids = _vmm_pool(layout, pages, 8 * PIECE if name == "wb_p8" else PIECE)
            self.pools.append((dev, kv, ids))
            if layout is Layout.CONTIGUOUS:
                ts = [ts[0][i * region:(i + 1) * region] for i in range(REGIONS)]
        else:
            try:
                rb = RawBacking(plan(name, REGIONS, pages), REGIONS * region)
            except DeviceError as err:
                self.skipped[name] = str(err)
                return
            self.raw[name] = rb
            whole = from_pointer(rb.base, rb.total)
            ts = [whole[i * region:(i + 1) * region] for i in range(REGIONS)]
        self.regions[name] = ts

    def close(self) -> dict[str, list[float]]:
        """Give everything back; each page-major raw plan's shrink seconds per page id."""
        import torch

        torch.cuda.synchronize()  # nothing may still run over a range about to be unmapped
        self.regions.clear()
        shrink = {}
        for name, rb in self.raw.items():
            shrink[name] = per_page(rb.close(), rb.handles)
        for dev, kv, ids in self.pools:
            kv.free(ids)
            kv.close()
            dev.close()
        self.raw.clear()
        self.pools.clear()
        torch.cuda.empty_cache()
        return shrink


def _measure(subj: Subjects, kind: str, repeats: int, reps: int) -> dict:
    """Every subject through ``kind``, ``repeats`` interleaved repeats; ratios against REF."""
    names = list(subj.regions)
    fns = {}
    for i, n in enumerate(names):
        _fill(subj.regions[n], 7 * i + 1)  # fresh random data, never zeros
        fns[n] = _ext_kernel(kind, subj.regions[n])
    nbytes = fns[REF][1]
    t: dict[str, list[float]] = {n: [] for n in names}
    first: dict[str, list[float]] = {n: [] for n in names}
    before_ref: dict[str, list[bool]] = {n: [] for n in names}
    for r in range(repeats):
        order = rotation(names, r)
        for n in order:
            f, m = _times(fns[n][0], reps)
            first[n].append(f)
            t[n].append(m)
            before_ref[n].append(order.index(n) < order.index(REF))
    out = {}
    for n in names:
        ratios = [p / v for p, v in zip(t[REF], t[n], strict=True)]
        out[n] = {"TBps": nbytes / statistics.median(t[n]) / 1e12, "ratio": deciles(ratios),
                  "ratios": ratios,
                  "first_ratio": deciles([p / v for p, v in zip(first[REF], first[n],
                                                                strict=True)]),
                  "ratio_before_ref": deciles([x for x, b in zip(ratios, before_ref[n],
                                                                 strict=True) if b]),
                  "ratio_after_ref": deciles([x for x, b in zip(ratios, before_ref[n],
                                                                strict=True) if not b])}
    return {"bytes_moved": nbytes, "subjects": out}


def probe(pages: int, names: tuple[str, ...], kernels: tuple[str, ...], repeats: int,
          reps: int) -> dict:
    """One region size: build every subject, measure every kernel, give everything back."""
    subj = Subjects()
    try:
        for n in names:
            subj.build(n, pages)
        res: dict[str, Any] = {"pages": pages, "region_MiB": pages * PIECE >> 20,
                               "total_GiB": REGIONS * pages * PIECE / GiB,
                               "skipped": subj.skipped, "plain_segments": subj.segments,
                               "kernels": {}}
        res["grow_us_per_page_id"] = {n: deciles([s * 1e6 for s in per_page(rb.grow_s,
                                                                           rb.handles)])
                                      for n, rb in subj.raw.items() if n in PAGE_MAJOR}
        res["page_id_MiB"] = {n: sum(h.size for h in rb.handles if h.page == 0) >> 20
                              for n, rb in subj.raw.items() if n in PAGE_MAJOR}
        for k in kernels:
            res["kernels"][k] = _measure(subj, k, repeats, reps)
    finally:
        shrink = subj.close()
    res["shrink_us_per_page_id"] = {n: deciles([s * 1e6 for s in xs])
                                    for n, xs in shrink.items() if n in PAGE_MAJOR}
    return res


def _f(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def summary_lines(res: dict) -> list[str]:
    lines = []
    for r in res["runs"]:
        head = f"{r['region_MiB']} MiB x {REGIONS}"
        for k, kr in r["kernels"].items():
            for n, s in kr["subjects"].items():
                q, f = s["ratio"], s["first_ratio"]
                lines.append(f"probe {head} {k:<4} {n:<12} /plain_each {q['median']:.4f} "
                             f"[p10 {q['p10']:.4f}, p90 {q['p90']:.4f}] n={q['n']} "
                             f"{s['TBps']:.3f} TB/s; first-run ratio {f['median']:.3f}; "
                             f"before/after ref {_f(s['ratio_before_ref']['median'])}/"
                             f"{_f(s['ratio_after_ref']['median'])}")
        for what in ("grow", "shrink"):
            for n, q in r.get(f"{what}_us_per_page_id", {}).items():
                mib = r["page_id_MiB"][n]
                lines.append(f"probe {head} {what} per page id ({mib} MiB) {n:<9} median "
                             f"{q['median']:.0f} us [p10 {q['p10']:.0f}, p90 {q['p90']:.0f}] "
                             f"n={q['n']}, {q['median'] * 1024 / mib:.0f} us/GiB")
        for n, why in r["skipped"].items():
            lines.append(f"probe {head} skipped {n}: {why}")
        lines.append(f"probe {head} plain segments {r['plain_segments']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=32, help="pieces per region (32: 4 GiB)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sweep", type=int, nargs="*", default=[16, 128],
                    help="other pieces-per-region values, for sum and add")
    ap.add_argument("--out", default=None, help="write the full results as JSON here")
    a = ap.parse_args(argv)
    if a.out:
        check(a.out)  # before the run
    res: dict[str, list] = {"runs": []}
    runs = [(a.pages, MAIN, KERNELS, a.reps)] + [(p, SWEEP, ("sum", "add"), max(5, a.reps // 2))
                                                 for p in a.sweep]
    for pages, names, kernels, reps in runs:  # each size's lines as soon as it is done
        res["runs"].append(probe(pages, names, kernels, a.repeats, reps))
        for line in summary_lines({"runs": res["runs"][-1:]}):
            print(line)
        if a.out:
            write_text(a.out, dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
