"""The output-equality lab's runs: every case against its own reference, over the seeds, the case
order reversed on odd seeds (seed 003 §2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.backends import capabilities
from workbench.labs.kit.base import Progress

if TYPE_CHECKING:
    from workbench.labs.output_equality.params import OutputEqualityParams

# The registry model's decoder with wider KV heads (4 KiB of K or V per token and layer: 512
# tokens a 2 MiB page), and for the recycling case prompts long enough that one wave spans
# several pages, so pages really are unmapped and mapped again; the tiny model's own 512-byte
# tokens would all sit on page 0.
WIDE = {"q_heads": 8, "kv_heads": 8, "head_dim": 256}
POOL = 64 << 20  # bytes of KV (all layers): 256 blocks of 16 tokens
LONG = {"first": 384, "step": 64}  # the recycling case's prompt lengths: 384, 448, ...
SPARE = 2  # the pressure case's pool: the largest request's blocks + the null block + SPARE


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    factor: str  # the one thing that differs from the reference
    run: dict[str, Any]
    ref: dict[str, Any] = field(default_factory=lambda: {"backend": "static"})


def cases(tight_bytes: int) -> list[Case]:
    recycle = {"max_reserved_pages": 0, "min_reserved_pages": 0}
    return [
        Case("elastic", "memory: elastic (VMM pages) instead of static", {"backend": "vmm"}),
        Case("elastic, token layout", "memory and layout: elastic, per-layer token slots "
             "(SGLang-style) instead of blocks", {"backend": "vmm", "style": "token"}),
        Case("elastic, pages recycled", "memory, with no reserve: pages unmapped after wave 1 "
             "and mapped again for wave 2 (long prompts)",
             {"backend": "vmm", "waves": 2, "long": True, **recycle},
             {"backend": "static", "waves": 2, "long": True}),
        Case("elastic, under pressure", "memory, in a pool that holds the largest request but "
             "not the batch: preemption and recompute",
             {"backend": "vmm", "kv_bytes": tight_bytes, **recycle},
             {"backend": "static", "kv_bytes": tight_bytes}),
    ]


def first_difference(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per prompt: the first output position where the tokens differ (None: identical)."""
    return [next((i for i, (x, y) in enumerate(zip(p, q, strict=False)) if x != y),
                 None if len(p) == len(q) else min(len(p), len(q))) for p, q in zip(a, b,
                                                                                   strict=True)]


def run_all(p: OutputEqualityParams, backend: str,
            progress: Progress | None = None) -> dict[str, Any]:
    import torch

    device = capabilities(backend).torch_device or backend
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # small matrices: one thread is fastest on a shared CPU
    try:
        bench = Bench(p.model, device, WIDE)
        n_prompts, n_tokens = (4, 24) if p.quick else (8, 48)
        seeds = [p.seed] if p.quick else [p.seed, p.seed + 1, p.seed + 2]
        rows, canaries = [], []
        steps = [0, len(seeds) * (1 + 4 + len(WRONG_LAYOUTS))]

        def tick(what: str) -> None:
            steps[0] += 1
            if progress:
                progress(steps[0], steps[1], what)

        for i, seed in enumerate(seeds):
            r, c, tight = run_seed(bench, seed, n_prompts, n_tokens, i % 2 == 1, tick)
            rows += r
            canaries += c
        elastic_canary = bench.run("vmm", [[1]], 1, kv_bytes=POOL)["canary"]
    finally:
        torch.set_num_threads(threads)
    return {"rows": rows, "canaries": canaries, "elastic_canary": elastic_canary,
            "seeds": seeds, "backend": backend, "prompts": n_prompts, "max_tokens": n_tokens,
            "device": device, "model": {"name": p.model, **WIDE,
                                        "layers": bench.cfg.num_layers},
            "pool_bytes": POOL, "tight_bytes": tight}


def run_seed(bench: Bench, seed: int, n_prompts: int, n_tokens: int, flip: bool,
             tick) -> tuple[list[dict], list[dict], int]:
    """One seed: paged vs dense, the equality cases (order flipped on request), the canaries."""
    prompts = make_prompts(bench.cfg.vocab_size, n_prompts, seed)
    long_prompts = make_prompts(bench.cfg.vocab_size, n_prompts, seed, **LONG)
    longest = -(-(max(map(len, prompts)) + n_tokens) // 16)
    tight = (longest + 1 + SPARE) * 16 * bench.cfg.kv_bytes_per_token
    base = bench.run("static", prompts, n_tokens, kv_bytes=POOL)
    dense = bench.dense(prompts, n_tokens)
    row = _row("paged vs dense", "attention: paged KV (static) instead of dense (no cache, the "
               "whole sequence each step)", seed, base, {"tokens": dense})
    row["near_tie_gaps"] = [round(bench.top2_gap(prompts[j], dense[j], d), 5)
                            for j, d in enumerate(row["first_difference"]) if d is not None]
    rows, canaries = [row], []
    tick(f"paged vs dense seed {seed}")
    todo = cases(tight)
    for c in (todo[::-1] if flip else todo):
        kw_ref, kw_got = dict(c.ref), dict(c.run)
        use = long_prompts if kw_got.pop("long", False) | kw_ref.pop("long", False) else prompts
        ref = bench.run(prompts=use, n=n_tokens, **{"kv_bytes": POOL, **kw_ref})
        got = bench.run(prompts=use, n=n_tokens, **{"kv_bytes": POOL, **kw_got})
        rows.append(_row(c.name, c.factor, seed, got, ref))
        tick(f"{c.name} seed {seed}")
    for layout in WRONG_LAYOUTS:
        got = bench.run("static", prompts, n_tokens, kv_bytes=POOL, layout=layout)
        canaries.append({"seed": seed, "layout": layout, **_row(layout, "views", seed, got, base),
                         "canary_checked": got["canary"]["checked"],
                         "canary_wrong": got["canary"]["wrong"]})
        tick(f"canary {layout} seed {seed}")
    return rows, canaries, tight


def _row(name: str, factor: str, seed: int, got: dict[str, Any],
         ref: dict[str, Any]) -> dict[str, Any]:
    diff = first_difference(got["tokens"], ref["tokens"])
    return {"case": name, "factor": factor, "seed": seed, "equal": got["tokens"] == ref["tokens"],
            "prompts_differing": sum(d is not None for d in diff), "first_difference": diff,
            "preemptions": got.get("preemptions"), "unmaps": got.get("unmaps"),
            "ref_preemptions": ref.get("preemptions")}


WRONG_LAYOUTS = ("none", "v-aliases-k", "layers-alias", "block-stride-half", "layers-permuted")


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
