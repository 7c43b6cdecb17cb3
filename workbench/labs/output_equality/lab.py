"""Output equality (seed 000 §13): the same greedy tokens with static and elastic KV, and a canary
that catches a wrong KV layout the memory curves cannot show.

A real engine is needed to produce tokens, so this lab runs the mini engine (a Llama-shaped
decoder with seeded random weights) on ``host`` (the CPU; elastic KV on the host VMM device) or
``gpu`` (CUDA virtual memory). The simulator has no tokens: ``sim`` is refused.

* **Equality** (§13.1, §13.2): the reference is native (static) KV with the block layout; each
  case changes one thing: elastic memory; elastic with the per-layer token-slot layout; elastic
  with pages unmapped and mapped again between two waves; elastic under a pool so small that
  requests are preempted and recomputed (against static of the same size). Plus paged attention
  against dense attention (no KV cache at all).
* **Canary** (§13.3): views that disagree with the geometry (V over K, every layer over layer 0,
  half the block stride, layers permuted) are injected into an engine on static memory, where a
  wrong address reads stale bytes instead of faulting -- the silent case. The canary writes a
  mark into every (layer, K/V, block) through the engine's views and reads each back where the
  geometry says it lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.labs.kit.base import Lab, LabResult, Progress

WRONG_LAYOUTS = ("none", "v-aliases-k", "layers-alias", "block-stride-half", "layers-permuted")


@dataclass(slots=True)
class OutputEqualityParams:
    quick: bool = False  # 4 prompts x 24 tokens, one seed; else 8 x 48, three seeds
    seed: int = 0  # prompt seed (the model's weights are seeded by the model config)
    model: str = "tiny"  # a mini-engine model (workbench.mini.model.get_config)


def make_prompts(vocab: int, n: int, seed: int, first: int = 16,
             step: int = 32) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (first + step * i,), generator=g).tolist() for i in range(n)]


class Bench:
    """One model on one device; builds engines and runs prompts through them."""

    def __init__(self, model: str, device: str, overrides: dict[str, int] | None = None):
        from workbench.mini.model import build_model, get_config

        self.cfg = get_config(model, **(overrides or {}))
        self.device = device
        self.model = build_model(self.cfg, device)

    def engine(self, backend: str, style: str = "block", kv_bytes: int = 8 << 20, **kv):
        from workbench.mini.engine import Engine
        from workbench.mini.kv import KVSpec

        spec = KVSpec(style=style, backend=backend, kv_bytes=kv_bytes,
                      block_size=16 if style == "block" else 1, **kv)
        return Engine(self.cfg, spec, self.device, model=self.model)

    def run(self, backend: str, prompts: list[list[int]], n: int, *, waves: int = 1,
            layout: str = "none", **kw) -> dict[str, Any]:
        """Greedy tokens of ``prompts`` (in ``waves`` sent one after the other), the canary's
        count, and how many pages were unmapped while it ran."""
        from workbench.core.events import PageState

        gone = (PageState.FREE.value, PageState.RECLAIMED.value)
        eng = self.engine(backend, **kw)
        unmaps = [0]

        def count(e) -> None:
            unmaps[0] += e.page >= 0 and e.dst in gone and e.src not in gone

        eng.kv.manager.events.subscribe(count)
        try:
            mark = canary(eng.kv, wrong_views(eng.kv, layout))
            out: dict[int, list[int]] = {}
            for w in range(waves):
                idx = list(range(len(prompts)))[w::waves]
                out.update(zip(idx, eng.generate([prompts[i] for i in idx], n), strict=True))
            return {"tokens": [out[i] for i in range(len(prompts))], "canary": mark,
                    "preemptions": eng.num_preemptions, "misses": eng.scheduler.stats.misses,
                    "unmaps": unmaps[0]}
        finally:
            eng.close()

    def top2_gap(self, prompt: list[int], tokens: list[int], at: int) -> float:
        """Dense attention's gap between its two best logits before output ``at``, relative to
        the best: a near tie that bf16 rounding may flip."""
        import torch

        from workbench.mini.attention import DenseContext, softmax_scale

        seq = torch.tensor(prompt + tokens[:at], device=self.device)
        with torch.no_grad():
            logits = self.model(seq, torch.arange(len(seq), device=self.device),
                                DenseContext(softmax_scale(self.cfg.head_dim)))[-1].float()
        top = logits.topk(2).values
        return float((top[0] - top[1]) / top[0].abs().clamp_min(1e-6))

    def dense(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        import torch

        from workbench.mini.attention import DenseContext, softmax_scale

        ctx, outs = DenseContext(softmax_scale(self.cfg.head_dim)), []
        with torch.no_grad():
            for p in prompts:
                toks = list(p)
                for _ in range(n):
                    pos = torch.arange(len(toks), device=self.device)
                    logits = self.model(torch.tensor(toks, device=self.device), pos, ctx)
                    toks.append(int(logits[-1].argmax()))
                outs.append(toks[len(p):])
        return outs


def wrong_views(store, layout: str):
    """(K views, V views) per layer, deliberately wrong as ``layout`` names (``none``: the
    store's own). Built by the same view code, so only the arithmetic differs."""
    views, g = store._views, store.geometry  # the store's ground-truth views (its geometry)
    n = g.num_layers
    k, v = list(store.k), list(store.v)
    if layout == "v-aliases-k":  # the K/V buffer term of the offset dropped
        v = list(k)
    elif layout == "layers-alias":  # the layer term of the offset dropped
        k, v = [views.block_tensor(0, 0)] * n, [views.block_tensor(0, 1)] * n
    elif layout == "layers-permuted":  # each layer at the next one's offset: self-consistent
        k = [views.block_tensor((i + 1) % n, 0) for i in range(n)]
        v = [views.block_tensor((i + 1) % n, 1) for i in range(n)]
    elif layout == "block-stride-half":  # blocks of different layers overlap
        def half(t, layer: int, buf: int):
            stride = list(t.stride())
            stride[0] //= 2
            return views._strided(list(t.shape), stride,
                                  views._elems(views.space.view(layer, buf).offset))
        k = [half(t, i, 0) for i, t in enumerate(k)]
        v = [half(t, i, 1) for i, t in enumerate(v)]
    store.k[:], store.v[:] = k, v  # the engine reads and writes through these lists
    return k, v


def canary(store, kv: tuple[list, list], blocks: int = 8) -> dict[str, int]:
    """Write a distinct mark into every (layer, K/V, block) of ``blocks`` freshly allocated blocks
    through the views ``kv``, then read each block's bytes where the geometry puts them; count
    the ones that do not hold their own mark. The blocks are allocated through the ledger, so
    elastic pages are mapped; they are freed again before the engine runs."""
    import torch

    g = store.geometry
    n = max(1, min(blocks, 250 // (2 * g.num_layers)))  # marks stay exact in bf16 (<= 256)
    ids = store.manager.alloc(n)
    if ids is None:
        return {"checked": 0, "wrong": 0}
    try:
        def mark(layer: int, buf: int, j: int) -> float:
            return float(1 + (layer * 2 + buf) * n + j)

        for layer in range(g.num_layers):
            for buf in (0, 1):
                for j, b in enumerate(ids):
                    kv[buf][layer][b].fill_(mark(layer, buf, j))
        wrong = 0
        for layer in range(g.num_layers):
            for buf in (0, 1):
                for j, b in enumerate(ids):
                    got = store._views.block_bytes(layer, buf, b).view(torch.bfloat16)
                    wrong += not bool(torch.all(got == mark(layer, buf, j)))
        return {"checked": g.num_layers * 2 * n, "wrong": wrong}
    finally:
        store.manager.free(ids)


class OutputEqualityLab(Lab):
    name = "output-equality"
    description = ("the same greedy tokens with static and elastic KV (mini engine), and a "
                   "layout canary that flags deliberately wrong KV views (seed 000 §13)")
    params_type = OutputEqualityParams
    backends = ("host", "gpu")

    def run(self, params: OutputEqualityParams, backend: str = "host",
            progress: Progress | None = None) -> LabResult:
        from workbench.labs.output_equality.report import figures, markdown, record, tables
        from workbench.labs.output_equality.mini import run_all

        out = run_all(params, backend, progress)
        tabs = tables(out)
        return LabResult(record(out, tabs, params, backend), markdown(out, tabs, params),
                         tables=tabs, figures=figures(tabs))
