"""``workbench bench overhead``: the Python the workbench adds per page id, measured on a CPU.

``workbench bench vmm`` compares the workbench's grow and shrink with the bare driver calls on a
GPU. Here both run over :class:`~workbench.gpu.fakedriver.FakeDriver`, which answers at once, so
what is left is the Python each path costs: the workbench's minus the raw baseline's is the
overhead it adds per page id. On the H200 the raw calls took ~65-75 µs per contiguous page id
grow and ~100-115 µs shrink, ~3 ms per per-layer one (``python -m workbench.bench.vmm_probe``),
so a ratio of at most 1.10 needs that overhead within ~7 µs (contiguous grow) *on that host*. Its
CPU ran the same Python 2-3.5x slower than a desktop core, interleaved with driver calls (cold
caches), so the predicted ratio below is a lower bound there.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable

from workbench.bench.params import check
from workbench.core.geometry import Layout
from workbench.gpu.driver import use_driver
from workbench.gpu.fakedriver import FakeDriver

# Raw cost of one page id on the H200, interleaved as ``bench vmm`` runs it (vmm_probe, 2026-12-01:
# contiguous 75.6 / 116.9 µs, per-layer 3215 / 2590 µs), for the budget.
H200_RAW_US = {"contiguous": {"grow": 75.0, "shrink": 117.0},
               "per_layer": {"grow": 3200.0, "shrink": 2600.0}}


def measure(layout: Layout, pages: int = 40, rounds: int = 8, repeats: int = 5) -> dict:
    """Per-page-id grow and shrink µs of every ``bench vmm`` subject over the instant driver:
    medians over ``repeats`` runs of the interleaved rounds."""
    from workbench.bench.vmm import GOAL_RATIO, grow_shrink

    runs = []
    for _ in range(repeats):
        with use_driver(FakeDriver()):
            runs.append(grow_shrink(layout, pages, rounds))
    out: dict = {"layout": layout.value, "maps_per_page_id": runs[0]["maps_per_page_id"]}
    for subject in ("raw", "raw_zero", "workbench_nozero", "workbench_zero", "core_on_sim"):
        out[subject] = {k: sorted(r[subject][k] for r in runs)[len(runs) // 2]
                        for k in ("grow_us", "shrink_us")}
    for kind in ("grow", "shrink"):
        k = f"{kind}_us"
        raw = H200_RAW_US[layout.value][kind]
        added = out["workbench_nozero"][k] - out["raw"][k]
        added_zero = out["workbench_zero"][k] - out["raw_zero"][k]
        out[f"added_{kind}_us"] = added
        out[f"added_{kind}_zero_us"] = added_zero
        out[f"budget_{kind}_us"] = (GOAL_RATIO - 1) * raw
        out[f"predicted_ratio_{kind}"] = (raw + added) / raw
    return out


def run_overhead(pages: int = 40, rounds: int = 8, repeats: int = 5,
                 progress: Callable[[str], None] | None = None) -> dict:
    check("overhead", pages=pages, rounds=rounds, repeats=repeats)
    say = progress or (lambda _m: None)
    out = {}
    for layout in (Layout.CONTIGUOUS, Layout.PER_LAYER):
        say(f"overhead, {layout.value}")
        out[layout.value] = measure(layout, pages, rounds, repeats)
    say("overhead, layer by layer")
    out["split_contiguous_cpu_us"] = split()
    c_split = split(c_path=True)
    if c_split:  # the C fast path and its stand-in driver are built
        out["split_contiguous_c_cpu_us"] = c_split
    return out


def summary_lines(res: dict) -> list[str]:
    lines = []
    for name, us in res.get("split_contiguous_cpu_us", {}).items():
        lines.append(f"overhead split contiguous grow+shrink {name:<24} {us:6.2f} us (CPU)")
    for name, us in res.get("split_contiguous_c_cpu_us", {}).items():
        lines.append(f"overhead split contiguous grow+shrink {name:<24} {us:6.2f} us "
                     "(CPU, C fast path over the C stand-in driver)")
    for lay, r in res.items():
        if lay not in ("contiguous", "per_layer"):
            continue
        for kind in ("grow", "shrink"):
            lines.append(
                f"overhead {lay:<10} {kind:<6} raw {r['raw'][f'{kind}_us']:7.1f} us"
                f"  workbench {r['workbench_nozero'][f'{kind}_us']:7.1f}"
                f"  added {r[f'added_{kind}_us']:7.1f}"
                f" (zero page {r[f'added_{kind}_zero_us']:7.1f})"
                f"  budget {r[f'budget_{kind}_us']:6.1f}"
                f"  core on sim {r['core_on_sim'][f'{kind}_us']:6.1f}"
                f"  => H200 ratio ~{r[f'predicted_ratio_{kind}']:.3f}")
    return lines


def _cpu_us(fn: Callable[[], None], n: int, reps: int = 7) -> float:
    """Process CPU µs per call of ``fn``: the 2nd best of ``reps`` batches of ``n`` calls."""
    best = []
    for _ in range(reps):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        best.append((time.process_time() - t0) / n * 1e6)
    return sorted(best)[1]


def split(n: int = 4000, c_path: bool = False) -> dict[str, float]:
    """Where a contiguous grow + shrink's Python goes, layer by layer (CPU µs, cumulative):
    the raw driver calls, CudaDevice's batch, KVSpace, the page allocator, the ledger.

    ``c_path``: over the C stand-in driver (:mod:`workbench.gpu.cfakedriver`) with the C fast
    path, the raw calls issued from C in one call each way (None when either library is not
    built: ``make vmmfast``)."""
    from workbench.bench.vmm import _Workbench, model_geometry
    from workbench.gpu import cfakedriver, fastcalls
    from workbench.gpu.device import CudaDevice

    if c_path and not (fastcalls.LIBRARY.exists() and cfakedriver.LIBRARY.exists()):
        return {}
    with use_driver(cfakedriver.CFakeDriver() if c_path else FakeDriver()):
        geo = model_geometry(Layout.CONTIGUOUS, 8)
        dev = CudaDevice(0, zero_page=False, mem_info_ttl_s=60.0)
        w = _Workbench(dev, geo)
        kv, sp, cu = w.kv, w.kv.space, dev._cu
        s = geo.page_id_bytes
        va = sp.base + 6 * s
        tgt = ((va, s),)

        def raw() -> None:
            _, h = cu.cuMemCreate(s, dev._prop, 0)
            cu.cuMemMap(va, s, 0, h, 0)
            cu.cuMemSetAccess(va, s, dev._rw, 1)
            cu.cuMemUnmap(va, s)
            cu.cuMemRelease(h)

        if c_path:
            raw = _raw_c(dev, va, s)

        def device() -> None:
            dev.unmap_release(tgt, dev.map_targets(tgt))

        def space() -> None:
            sp.map_page(5)
            sp.prepare_unmap(5, release_next=True)
            sp.commit_unmap(5)

        def pages() -> None:
            kv.pages.free_page(kv.pages.alloc_page())

        def ledger() -> None:
            kv.free(kv.alloc(w.bpp))

        out = {name: _cpu_us(fn, n) for name, fn in (
            ("raw driver", raw), ("+ CudaDevice batch", device), ("+ KVSpace", space),
            ("+ page allocator", pages), ("+ ledger (alloc + free)", ledger))}
        w.close()
        dev.close()
    return out


def _raw_c(dev, va: int, size: int) -> Callable[[], None]:
    """The bare grow + shrink from C, one call each way (``bench vmm``'s raw_c)."""
    from workbench.gpu.fastcalls import HEAD, J_M, J_N, T_WORDS, TARGET, for_driver

    fast, _ = for_driver(dev._cu)
    fast.bind(dev._prop, dev._rw, dev._ro)
    call_map, call_unmap, arg, words, raw = fast.hot
    words[J_N] = words[J_M] = 1

    def raw_c() -> None:
        TARGET.pack_into(raw, 8 * HEAD, va, size, 0)
        call_map(arg)
        words[HEAD + T_WORDS] = words[HEAD + 3]  # the handle made, to release
        call_unmap(arg)

    return raw_c


def profile(layout: Layout = Layout.CONTIGUOUS, top: int = 20) -> str:
    """cProfile of the workbench subjects' grow and shrink over the instant driver."""
    from workbench.bench.vmm import grow_shrink

    prof = cProfile.Profile()
    with use_driver(FakeDriver()):
        prof.enable()
        grow_shrink(layout, 40, 8)
        prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()
