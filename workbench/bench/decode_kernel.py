"""Where a decode step's device time goes: the paged kernel's tiling sweep and the weight stream.

* :func:`tune`: the Triton paged decode kernel at the served shape (``batch`` sequences of ``ctx``
  tokens, the model's heads) for each candidate ``(TILE, num_warps, num_stages)``; the fastest is
  set in :data:`workbench.mini.attention.DECODE_TILING`, so engines (and their graphs) built
  afterwards use it. Each row: median time (CUDA events), KV bytes / time, and the relative error
  of the output against the fp32 reference.
* :func:`weight_stream`: one decode step's linear layers (every layer's four matrices and the LM
  head, ``batch`` rows) replayed from a CUDA graph: the time the weights alone take, against their
  bytes at the copy bandwidth.
"""

from __future__ import annotations

import torch

from workbench.mini import attention
from workbench.mini.attention import paged_decode, reference_decode, softmax_scale
from workbench.mini.model import ModelConfig

CANDIDATES = ((64, 4, 2), (64, 4, 3), (128, 4, 3), (128, 8, 3), (32, 4, 4), (64, 8, 4))


def _median_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def graph_ms(fn) -> float:
    """``fn``'s device work captured once as a CUDA graph; the median time of its replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile, pick algorithms: off the graph
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    ms = _median_ms(graph.replay)
    del graph
    return ms


def tune(cfg: ModelConfig, batch: int, ctx: int, block: int = 16, entry: int = 16,
         candidates=CANDIDATES, seed: int = 0) -> list[dict]:
    """Sweep the kernel's tiling at this shape; keep the fastest one that is also accurate."""
    nh, nkv, hd = cfg.q_heads, cfg.kv_heads, cfg.head_dim
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n_entries = -(-ctx // entry)
    units = batch * n_entries + 1  # entry 0 is the null block / slot
    nb = units * entry // block + 1
    kc = torch.randn(nb, block, nkv, hd, device="cuda", generator=gen, dtype=torch.bfloat16)
    vc = torch.randn(nb, block, nkv, hd, device="cuda", generator=gen, dtype=torch.bfloat16)
    table = (torch.randperm(units - 1, device="cuda", generator=gen) + 1).view(batch, n_entries)
    table = table.to(torch.int32)
    rows = torch.arange(batch, device="cuda")
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    q = torch.randn(batch, nh, hd, device="cuda", generator=gen, dtype=torch.bfloat16)
    sc = softmax_scale(hd)
    ref = reference_decode(q, kc, vc, table, lens, entry, sc).double()
    kv_bytes = 2 * batch * ctx * nkv * hd * 2
    out = []
    for tiling in candidates:
        def run(t=tiling):
            return paged_decode(q, kc, vc, table, lens, entry, sc, "triton", rows, tiling=t)
        try:
            err = ((run().double() - ref).norm() / ref.norm()).item()
            ms = _median_ms(run)
        except Exception as exc:  # noqa: BLE001 - a tiling this GPU cannot run is skipped
            out.append({"tiling": tiling, "error": str(exc).splitlines()[0][:200]})
            continue
        out.append({"tiling": tiling, "ms": ms, "TBps": kv_bytes / ms / 1e9, "rel_err": err})
    ok = [r for r in out if "ms" in r and r["rel_err"] < 2e-2]
    if ok:
        best = min(ok, key=lambda r: r["ms"])
        attention.DECODE_TILING[(nh // nkv, hd, entry, block)] = tuple(best["tiling"])
        best["chosen"] = True
    return out


def weight_stream(model: torch.nn.Module, batch: int) -> dict:
    """Median time of every linear layer of one decode step at ``batch`` rows (graph replay)."""
    mats = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    xs = {w.shape[1]: torch.randn(batch, w.shape[1], device="cuda", dtype=w.dtype)
          for w in mats}

    def step():
        for w in mats:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    ms = graph_ms(step)
    nbytes = sum(w.numel() * w.element_size() for w in mats)
    return {"batch": batch, "ms": ms, "bytes": nbytes, "TBps": nbytes / ms / 1e9,
            "matrices": len(mats)}


def summary(rows: list[dict], stream: dict) -> list[str]:
    lines = [f"  weights alone (graph of {stream['matrices']} matmuls, B={stream['batch']}): "
             f"{stream['ms']:.3f} ms = {stream['TBps']:.2f} TB/s over "
             f"{stream['bytes'] / 1e9:.2f} GB"]
    for r in rows:
        if "ms" in r:
            lines.append(f"  paged decode tiling {tuple(r['tiling'])}: {r['ms']:.3f} ms = "
                         f"{r['TBps']:.2f} TB/s (err {r['rel_err']:.1e})"
                         + ("  <- chosen" if r.get("chosen") else ""))
        else:
            lines.append(f"  paged decode tiling {tuple(r['tiling'])}: failed: {r['error']}")
    return lines
