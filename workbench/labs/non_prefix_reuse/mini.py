"""A quality *proxy* for blended reuse (seed 003 E9), on the mini model's tiny decoder on the CPU.

The mini model has random weights, so no task quality can be measured. What can be computed is
how far blending moves the model's next-token distribution away from a full prefill's, on the
same prompt: the KL divergence ``KL(full || blend)`` and whether the top-1 token agrees. Small
numbers here do not show that blending keeps answers right — the seed forbids that conclusion
without a task-level evaluation — they show how much of the full prefill's computation the
recomputed fraction restores.

Blending follows CacheBlend's idea on the model's own layers through the attention context
(:meth:`attend` is the mini model's seam): every document's K/V is computed *alone* (at its
target positions, which stands for exact re-rotation), then only the selected tokens (all fresh
tokens plus an evenly spread fraction of the document tokens) are run through the layers; at
each layer their fresh K/V replace the stored rows and they attend the whole mixed cache.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

RATIOS = (0.0, 0.15, 0.3, 0.6, 1.0)


def _attend(q, k, v, qpos, kpos):
    import torch

    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.einsum("thd,shd->hts", q.float(), k.float()) / math.sqrt(q.shape[-1])
    s = s.masked_fill(kpos[None, None, :] > qpos[None, :, None], float("-inf"))
    return torch.einsum("hts,shd->thd", s.softmax(-1), v.float()).to(q.dtype)


class DenseCtx:
    """Causal attention among this forward's tokens; keeps every layer's K/V."""

    def __init__(self, positions):
        self.pos = positions
        self.k: dict[int, Any] = {}
        self.v: dict[int, Any] = {}

    def attend(self, layer: int, q, k, v):
        self.k[layer], self.v[layer] = k, v
        return _attend(q, k, v, self.pos, self.pos)


class BlendCtx:
    """Selected tokens attend a stored K/V in which their own rows are recomputed."""

    def __init__(self, k: dict, v: dict, positions, selected):
        self.k, self.v, self.pos, self.sel = k, v, positions, selected

    def attend(self, layer: int, q, k, v):
        kk, vv = self.k[layer].clone(), self.v[layer].clone()
        kk[self.sel], vv[self.sel] = k, v
        return _attend(q, kk, vv, self.pos[self.sel], self.pos)


def _segments(case: str, rng: np.random.Generator, sizes: dict[str, int], vocab: int):
    """[(tokens, kind)] with kind 'stored' (saved alone before) or 'fresh'."""
    tok = lambda n: rng.integers(1, vocab, size=n).tolist()  # noqa: E731
    pre, docs = tok(sizes["pre"]), [tok(sizes["doc"]) for _ in range(sizes["docs"] + 1)]
    base = list(range(sizes["docs"]))
    order = {"same-order": base, "reordered": base[::-1], "new-preamble": base,
             "swapped-doc": [sizes["docs"]] + base[1:]}[case]
    segs = [(pre, "stored")] + [(docs[i], "stored") for i in order]
    if case == "new-preamble":
        segs.insert(0, (tok(sizes["pre"]), "fresh"))
    return segs + [(tok(sizes["question"]), "fresh")], case == "same-order"


def measure(case: str, seed: int, ratios: tuple[float, ...] = RATIOS) -> list[dict[str, Any]]:
    import torch

    from workbench.mini.model import build_model, get_config

    torch.manual_seed(seed)
    cfg = get_config("tiny", num_layers=4, seed=seed)
    model = build_model(cfg, dtype=torch.float32)
    rng = np.random.default_rng([seed, 19])
    segs, exact = _segments(case, rng, {"pre": 32, "doc": 64, "docs": 4, "question": 8},
                            cfg.vocab_size)
    ids = torch.tensor([t for s, _ in segs for t in s])
    pos = torch.arange(len(ids))
    full = model(ids, pos, DenseCtx(pos), torch.tensor([len(ids) - 1]))[0].log_softmax(-1)
    # the exact prefix (what the earlier prompt shares) is computed in context, as a prefix
    # cache holds it; every later stored segment alone at its target positions (re-rotated)
    n_pre = sum(len(s) for s, _ in segs[:-1]) if exact else \
        (len(segs[0][0]) if segs[0][1] == "stored" else 0)
    k = {i: torch.zeros(len(ids), cfg.kv_heads, cfg.head_dim) for i in range(cfg.num_layers)}
    v = {i: torch.zeros_like(k[i]) for i in k}
    pieces = [(0, n_pre)] if n_pre else []
    blendable: list[int] = []
    fresh: list[int] = []
    start = 0
    for s, kind in segs:
        if start >= n_pre:
            if kind == "stored":
                pieces.append((start, start + len(s)))
                blendable.extend(range(start, start + len(s)))
            else:
                fresh.extend(range(start, start + len(s)))
        start += len(s)
    for a, b in pieces:
        ctx = DenseCtx(pos[a:b])
        model(ids[a:b], pos[a:b], ctx)
        for i in k:
            k[i][a:b], v[i][a:b] = ctx.k[i], ctx.v[i]
    out = []
    for ratio in ratios:
        m = math.ceil(ratio * len(blendable))
        pick = [blendable[i] for i in np.linspace(0, len(blendable) - 1, m).astype(int)] \
            if m else []
        sel = torch.tensor(sorted(set(fresh) | set(pick)))
        got = model(ids[sel], pos[sel], BlendCtx(k, v, pos, sel),
                    torch.tensor([len(sel) - 1]))[0].log_softmax(-1)
        kl = float((full.exp() * (full - got)).sum())
        out.append({"case": case, "seed": seed, "ratio": ratio, "kl": max(kl, 0.0),
                    "top1_agrees": bool(full.argmax() == got.argmax()),
                    "recomputed": len(sel), "tokens": len(ids)})
    return out


def quality(cases: tuple[str, ...], seeds: list[int]) -> dict[str, Any]:
    rows = [r for s in seeds for c in cases for r in measure(c, s)]
    lines = ["A **proxy**, not quality: the mini model's tiny decoder (4 layers, random "
             "weights) on a scaled-down prompt (32-token preamble, four 64-token documents, an "
             "8-token question). KL(full ‖ blend) of the next-token distribution and top-1 "
             "agreement, mean over seeds. The seed's caution stands: only a task-level "
             "evaluation on trained weights can say whether answers stay right.", "",
             "| case | " + " | ".join(f"ratio {r:g}" for r in RATIOS) + " |",
             "|---|" + "---|" * len(RATIOS)]
    for c in cases:
        cells = []
        for ratio in RATIOS:
            xs = [r for r in rows if r["case"] == c and r["ratio"] == ratio]
            kl = sum(x["kl"] for x in xs) / len(xs)
            agree = sum(x["top1_agrees"] for x in xs)
            cells.append(f"KL {kl:.2e}, top-1 {agree}/{len(xs)}")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    worst = max(r["kl"] for r in rows if r["ratio"] == 0.0)
    return {"rows": rows, "markdown": "\n".join(lines),
            "summary": f"KL(full || blend) at ratio 0 up to {worst:.2e}; at ratio 1 "
                       f"{max(r['kl'] for r in rows if r['ratio'] == 1.0):.1e}"}
