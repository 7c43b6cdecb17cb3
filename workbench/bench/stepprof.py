"""Where a graphed decode step's time goes, measured rather than attributed.

Device side (:func:`device_parts`): the model's decode forward at ``batch`` sequences of ``ctx``
tokens over a random paged KV (block style, 16-token blocks, every layer), and each of its parts
alone, each captured as a CUDA graph and timed by replay (median, ``triton.testing.do_bench``):

* ``forward``: the whole decode forward, as the engine's graph runs it;
* ``matmuls``: every linear layer (:func:`workbench.bench.decode_kernel.weight_stream`);
* ``paged kernel``: the paged decode kernel of every layer;
* ``attention glue``: what ``AttnContext.attend`` adds around the kernel (the K/V writes into the
  cache, the lengths cast, the output copy), every layer;
* ``norms + adds``, ``rotary``, ``silu x up``: the element-wise ops of every layer;
* ``rest``: the forward minus the parts (embedding, logits cast, gaps between kernels).

Each is measured with the torch element-wise ops and with the fused Triton kernels
(:mod:`workbench.mini.fused`). Where the profiler can trace the device, :func:`kernel_table`
lists an eager forward's kernels by total device time as a cross-check.

Host side (:func:`host_split`): an engine's graphed steps with its host calls timed (the
scheduler's ``schedule`` and ``update``, the device table's ``update``, the graph's input copy and
launch), against the step's wall time and the forward's CUDA-event time.

Measured on one H200 (2026-12-01, ``python -m workbench.bench.ab --parts steady --steady-profile``,
Llama-3.1-8B shape, context 1168), ms per forward at batch 128, torch element-wise -> fused:
forward 12.70 -> 10.79; norms + adds 0.96 -> 0.17; rotary 0.74 -> 0.07; SiLU x up 0.38 -> 0.09;
paged kernel 5.35 (3.67 TB/s of KV); K/V writes 0.32; matmuls 4.77 (3.15 TB/s); rest 0.03. At
batch 64: forward 9.21 -> 7.58, paged kernel 2.59, matmuls 4.34. Host per graphed step at 128:
schedule 0.16, table update 0.30, inputs + launch 0.34, scheduler update 0.34.
"""

from __future__ import annotations

import statistics
import time

import torch

from workbench.bench import decode_kernel
from workbench.mini import fused
from workbench.mini.attention import AttnContext, paged_decode, softmax_scale
from workbench.mini.model import ModelConfig

BLOCK = 16


graph_ms = decode_kernel.graph_ms  # replaced by a fake in the CPU test


def decode_inputs(cfg: ModelConfig, batch: int, ctx: int, seed: int = 0,
                  device: str = "cuda") -> dict:
    """A decode step's inputs over a random block-style cache: ``batch`` sequences, each with
    ``ctx`` cached tokens and one new token at position ``ctx``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    per_seq = ctx // BLOCK + 1
    nb = batch * per_seq + 1  # block 0: the null block
    shape = (cfg.num_layers, nb, BLOCK, cfg.kv_heads, cfg.head_dim)
    k = torch.randn(shape, device=device, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(shape, device=device, generator=gen, dtype=torch.bfloat16)
    table = (torch.randperm(nb - 1, device=device, generator=gen) + 1).view(batch, per_seq)
    table = table.to(torch.int32)
    rows = torch.arange(batch, device=device)
    pos = torch.full((batch,), ctx, device=device, dtype=torch.long)
    wslots = table[:, ctx // BLOCK].long() * BLOCK + ctx % BLOCK
    lens = pos + 1  # int64, as the graph's input buffer holds it
    attn = AttnContext(list(k), list(v), wslots, batch, table, lens, BLOCK, [],
                       softmax_scale(cfg.head_dim), "auto", rows=rows)
    ids = torch.randint(0, cfg.vocab_size, (batch,), device=device, generator=gen)
    return {"ids": ids, "pos": pos, "ctx": attn, "k": k, "v": v, "table": table,
            "rows": rows, "lens32": lens.to(torch.int32)}


def _parts(model, cfg: ModelConfig, inp: dict, kernels: str) -> dict[str, float]:
    """Every element-wise part of one forward, alone, with ``kernels``."""
    dev = inp["ids"].device
    b, h, nh, nkv, hd = (inp["ids"].shape[0], cfg.hidden_size, cfg.q_heads,
                         cfg.kv_heads, cfg.head_dim)
    x = torch.randn(b, h, device=dev, dtype=torch.bfloat16)
    res = torch.randn(b, h, device=dev, dtype=torch.bfloat16)
    qkv = torch.randn(b, nh + 2 * nkv, hd, device=dev, dtype=torch.bfloat16)
    gu = torch.randn(b, 2 * cfg.intermediate_size, device=dev, dtype=torch.bfloat16)
    q, k, v = qkv[:, :nh], qkv[:, nh:nh + nkv], qkv[:, nh + nkv:]
    layers, attn = model.layers, inp["ctx"]

    def norms():
        for blk in layers:
            blk.attn_norm(x, res)
            blk.mlp_norm(x, res)
        model.norm(x, res)

    def rotary():
        rope = model.rope.at(inp["pos"], kernels)
        for _ in layers:
            rope.rotate_(qkv[:, :nh + nkv])

    def silu():
        for _ in layers:
            fused.silu_mul(gu, kernels)

    def kernel():
        for i in range(len(layers)):
            paged_decode(q, inp["k"][i], inp["v"][i], inp["table"], inp["lens32"], BLOCK,
                         attn.scale, "auto", inp["rows"])

    def attend():
        for i in range(len(layers)):
            attn.attend(i, q, k, v)

    def forward():
        model(inp["ids"], inp["pos"], attn)

    with torch.inference_mode():
        out = {name: graph_ms(fn) for name, fn in (
            ("forward", forward), ("norms + adds", norms), ("rotary", rotary),
            ("silu x up", silu), ("paged kernel", kernel), ("attend", attend))}
    out["attention glue"] = out.pop("attend") - out["paged kernel"]
    return out


def device_parts(model, cfg: ModelConfig, batch: int, ctx: int) -> dict:
    """The forward and its parts with torch and with fused element-wise ops (ms each)."""
    inp = decode_inputs(cfg, batch, ctx)
    before = model.kernels
    try:
        matmuls = decode_kernel.weight_stream(model, batch)["ms"]
        res: dict = {"batch": batch, "ctx": ctx, "matmuls": matmuls}
        for kernels in ("torch", "triton"):
            model.use_kernels(kernels)
            p = _parts(model, cfg, inp, kernels)
            p["matmuls"] = matmuls
            p["rest"] = p["forward"] - sum(v for k, v in p.items() if k != "forward")
            res[kernels] = p
            res[f"kernels_{kernels}"] = kernel_table(model, inp)
    finally:
        model.use_kernels(before)
        del inp
        torch.cuda.empty_cache()
    return res


def kernel_table(model, inp: dict, top: int = 12) -> list[dict] | str:
    """The eager forward's device kernels by total time (torch.profiler), or why there are none."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with torch.inference_mode():
            model(inp["ids"], inp["pos"], inp["ctx"])
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                model(inp["ids"], inp["pos"], inp["ctx"])
                torch.cuda.synchronize()
        rows = [{"kernel": e.key[:70], "count": e.count, "us": e.self_device_time_total}
                for e in prof.key_averages() if e.self_device_time_total > 0]
    except Exception as exc:  # noqa: BLE001 - no device tracing here: the graph parts stand
        return f"profiler failed: {str(exc).splitlines()[0][:160]}"
    if not rows:
        return "profiler saw no device kernels"
    rows.sort(key=lambda r: -r["us"])
    total = sum(r["us"] for r in rows)
    return [{"kernel": "(all)", "count": sum(r["count"] for r in rows), "us": total},
            *rows[:top]]


def host_split(eng, steps: int) -> dict:
    """``steps`` steps of a full engine (graphed where it has graphs) with its host calls timed
    (ms per step; the forward's time is 0 off CUDA)."""
    acc: dict[str, float] = {}

    def timed(name: str, fn):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
        return call

    targets = [(eng.scheduler, "schedule", "schedule"), (eng.scheduler, "update", "sched update"),
               (eng.r2t, "update", "table update")]
    if eng.graphs is not None:
        targets.append((eng.graphs, "run", "inputs + launch"))
        eng.graphs.enabled = True
    for obj, attr, name in targets:
        setattr(obj, attr, timed(name, getattr(obj, attr)))
    eng.stats.steps.clear()
    try:
        for _ in range(steps):
            eng.step()
    finally:
        for obj, attr, _ in targets:
            delattr(obj, attr)  # back to the class's method
    st = eng.stats.steps
    out = {name: 1e3 * acc.get(name, 0.0) / steps for _, _, name in targets}
    out["step"] = 1e3 * statistics.median(s.seconds for s in st)
    out["forward"] = 1e3 * statistics.median(s.forward_seconds for s in st)
    out["outside forward"] = out["step"] - out["forward"]
    return out


def summary(dev: dict | None, host: dict | None) -> list[str]:
    lines = []
    if dev:
        t, f = dev["torch"], dev["triton"]
        lines.append(f"  device parts at B={dev['batch']}, context {dev['ctx']} (graph replay "
                     "medians, ms per forward): torch element-wise -> fused")
        for k in t:
            lines.append(f"    {k:15s} {t[k]:7.3f} -> {f[k]:7.3f}")
        for kernels in ("torch", "triton"):
            tab = dev[f"kernels_{kernels}"]
            if isinstance(tab, str):
                lines.append(f"    eager kernels ({kernels}): {tab}")
                continue
            lines.append(f"    eager kernels ({kernels}), device us per forward (count):")
            lines += [f"      {r['us']:9.1f} ({r['count']:5d}) {r['kernel']}" for r in tab]
    if host:
        lines.append("  host split of a graphed step (ms per step): " + ", ".join(
            f"{k} {v:.3f}" for k, v in host.items()))
    return lines
