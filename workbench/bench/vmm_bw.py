"""Bandwidth over VMM-backed KV against plainly allocated KV, like for like (``bench vmm``).

Two pairings, each with the same kernels and the same number of launches on both sides:

* ``contiguous``: the whole KV of a CONTIGUOUS pool (one tensor over its reservation, 128 MiB
  mappings) against one plain ``torch.empty`` of the same size: one launch per kernel.
* ``per_layer``: the ``layers x 2`` per-layer regions of a PER_LAYER pool (views over 2 MiB
  mappings) against as many plain tensors of the same size: one launch per region and kernel.
* ``per_layer_8MiB``: the same with ``page_size = 8 MiB`` (4x larger page ids). On an H200 the
  2 MiB pool's writes run ~3% slower than plain (``add`` 0.970) because each region's 2 MiB
  pieces are created page id by page id, so no two neighbours are physically adjacent; 8 MiB
  pieces cut that loss to under 1% (``python -m workbench.bench.vmm_bw_probe`` shows why).

Kernels: a read (``sum``) and a read-write (in-place ``add_``) over float32 views of random data.
Each repeat times both sides back to back (the order alternating between repeats) with CUDA events,
each the median of ``reps`` runs; the ratio VMM/plain of each repeat is one sample. Reported: the
median, p10 and p90 of the ratios, and each side's TB/s (bytes read plus bytes written).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from workbench.bench.stats import nearest_deciles
from workbench.bench.vmm_raw import model_geometry
from workbench.config import PoolConfig
from workbench.core.geometry import Layout
from workbench.core.ledger import KVCacheManager
from workbench.errors import DeviceError
from workbench.gpu.device import CudaDevice
from workbench.units import GiB, MiB

GOAL_BANDWIDTH = 0.99  # VMM / plain, like for like
KERNELS = ("sum", "add")
PAIRINGS = (("contiguous", Layout.CONTIGUOUS, 2 * MiB), ("per_layer", Layout.PER_LAYER, 2 * MiB),
            ("per_layer_8MiB", Layout.PER_LAYER, 8 * MiB))


def _time_cuda(fn: Callable[[], Any], reps: int, warmup: int = 3) -> float:
    """Median seconds of ``fn`` over ``reps`` runs, timed with CUDA events."""
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


def _kernel(kind: str, tensors: list) -> tuple[Callable[[], None], int]:
    """One launch per tensor of ``kind`` over all of ``tensors``; the bytes it moves."""
    import torch

    xs = [t.view(torch.float32) for t in tensors]
    nbytes = sum(x.numel() * 4 for x in xs)
    if kind == "sum":
        outs = [torch.empty((), dtype=torch.float32, device=x.device) for x in xs]

        def run() -> None:
            for x, o in zip(xs, outs, strict=True):
                torch.sum(x, dim=0, out=o)
        return run, nbytes

    def run_add() -> None:
        for x in xs:
            x.add_(1e-3)
    return run_add, 2 * nbytes


def _fill(tensors: list, seed: int) -> None:
    import torch

    for i, t in enumerate(tensors):
        x = t.view(torch.float32)
        g = torch.Generator(device=x.device).manual_seed(seed + i)
        x.uniform_(-1, 1, generator=g)


def _vmm_pool(layout: Layout, pages: int,
              page_size: int = 2 * MiB) -> tuple[CudaDevice, KVCacheManager, list, Any]:
    """A pool with every page mapped, and its KV as one tensor (contiguous) or one per region;
    ``pages`` counts 2 MiB pages whatever ``page_size`` (the same bytes in fewer, larger pages)."""
    from workbench.gpu.tensors import KVTensors

    dev = CudaDevice(0)
    geo = replace(model_geometry(layout, pages), page_size=page_size)
    cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, prealloc=False,
                     page_size=page_size)
    kv = KVCacheManager(geo, dev, name=f"bw-{layout.value}", config=cfg)
    ids = kv.alloc(geo.num_blocks - 1)  # every page mapped
    if ids is None:
        kv.close()
        dev.close()
        raise DeviceError("alloc", f"could not map {kv.space.size} bytes of KV for the bandwidth "
                                   "bench; free GPU memory or pass a smaller --bw-gib")
    raw = KVTensors(kv.space, "bf16").raw
    if layout is Layout.CONTIGUOUS:
        return dev, kv, [raw], ids
    region = geo.num_pages * geo.page_size
    n = geo.num_layers * geo.num_buffers
    return dev, kv, [raw[i * region:(i + 1) * region] for i in range(n)], ids


def bandwidth(gib: int = 4, repeats: int = 10, reps: int = 20) -> dict:
    """Every pairing, ``repeats`` interleaved repeats each; see the module docstring."""
    import torch

    pages = gib * GiB // (128 * MiB)
    out: dict[str, Any] = {"bytes": pages * 128 * MiB, "repeats": repeats, "reps": reps,
                           "pairings": {}}
    held = []
    try:
        for name, layout, page_size in PAIRINGS:
            dev, kv, vmm, ids = _vmm_pool(layout, pages, page_size)
            held.append((dev, kv, ids))
            plain = [torch.empty(t.numel(), dtype=torch.uint8, device="cuda") for t in vmm]
            _fill(vmm, 1)
            _fill(plain, 1)
            for kind in KERNELS:
                fv, nbytes = _kernel(kind, vmm)
                fp, _ = _kernel(kind, plain)
                tv, tp = [], []
                for r in range(repeats):
                    if r % 2 == 0:
                        tv.append(_time_cuda(fv, reps))
                        tp.append(_time_cuda(fp, reps))
                    else:
                        tp.append(_time_cuda(fp, reps))
                        tv.append(_time_cuda(fv, reps))
                out["pairings"][f"{name}_{kind}"] = {
                    "launches": len(vmm), "bytes_moved": nbytes,
                    "vmm_TBps": nbytes / statistics.median(tv) / 1e12,
                    "plain_TBps": nbytes / statistics.median(tp) / 1e12,
                    "ratio": nearest_deciles([p / v for v, p in zip(tv, tp, strict=True)]),
                }
            del plain, vmm
            torch.cuda.synchronize()
    finally:
        torch.cuda.synchronize()  # no kernel may still read a range about to be unmapped
        for dev, kv, ids in held:
            kv.free(ids)
            kv.close()
            dev.close()
    out["goal"] = GOAL_BANDWIDTH
    return out


def summary_lines(bw: dict) -> list[str]:
    """One line per pairing: VMM/plain median with p10/p90 over the repeats."""
    lines = []
    for name, r in bw["pairings"].items():
        q = r["ratio"]
        lines.append(f"bandwidth {name:<19} vmm/plain median {q['median']:.4f} "
                     f"[p10 {q['p10']:.4f}, p90 {q['p90']:.4f}] over {q['n']} repeats; "
                     f"{r['vmm_TBps']:.3f} vs {r['plain_TBps']:.3f} TB/s, "
                     f"{r['launches']} launch(es) each side (goal >= {bw['goal']})")
    return lines
