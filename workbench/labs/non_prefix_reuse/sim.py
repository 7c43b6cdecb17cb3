"""Non-prefix reuse (seed 003 E9; CacheBlend modelled, not measured): full prefill vs an exact
prefix cache vs blended reuse of retrieved document KV.

A RAG-style prompt is a system preamble, ``docs_per_prompt`` documents from a pool and a
question. Every document of the pool was prefilled before, alone, and its KV saved in the host
tier. Three schemes answer each case:

* **full prefill** computes every token (the reference for TTFT, and for quality);
* **exact prefix** reuses chunks under chained keys (:func:`workbench.tiers.chunk_keys`): only
  the leading chunks identical to a saved prompt, so any change early on ends the reuse;
* **blend** keeps the exact prefix, looks the rest up by position-free keys
  (:func:`workbench.tiers.content_keys`), loads every chunk found and recomputes a chosen
  fraction (``recompute_ratio``) of those reused tokens (CacheBlend's selected tokens, whose
  cross-attention to earlier documents matters most) plus every token not found. The selected
  tokens attend the whole context.

Cases follow the seed's coverage list: the same order (control), documents reordered, a new
preamble inserted, a document swapped for a new one (position change), and a tokenisation
boundary (a document shifted off the chunk grid: its chunks no longer match). Quality is not
measured on sim; the ``host`` backend adds a proxy on the mini model's tiny decoder
(:mod:`.mini`), with the seed's caution.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.engines.sim.steptime import StepTimeModel
from workbench.engines.sim.workloads import VOCAB
from workbench.labs.kit.base import Progress
from workbench.labs.kit.steptime import prefill_s
from workbench.tiers import TierCosts, content_keys, make_stack

if TYPE_CHECKING:
    from workbench.labs.non_prefix_reuse.params import NonPrefixReuseParams

CASES = ("same-order", "reordered", "new-preamble", "swapped-doc", "off-grid")
SCHEMES = ("full", "prefix", "blend")


def build_case(p: NonPrefixReuseParams, case: str, rng: np.random.Generator,
               pool: list[list[int]], pre: list[int]) -> tuple[list[int], list[int]]:
    """(the earlier prompt that warmed the prefix cache, this case's prompt)."""
    tok = lambda n: rng.integers(1, VOCAB, size=n).tolist()  # noqa: E731
    k = p.docs_per_prompt
    base = list(range(k))
    order = {"same-order": base, "reordered": base[::-1], "new-preamble": base,
             "swapped-doc": [k] + base[1:], "off-grid": base}[case]
    head = pre
    if case == "new-preamble":
        head = tok(p.preamble_len) + pre
    docs = [pool[i] for i in order]
    if case == "off-grid":  # one stray token before the documents shifts every chunk boundary
        head = pre + tok(1)
    earlier = pre + [t for i in base for t in pool[i]] + tok(p.question_len)
    return earlier, head + [t for d in docs for t in d] + tok(p.question_len)


def positions_prefill(st: StepTimeModel, positions: list[int], budget: int = 2048) -> float:
    """Recompute the tokens at ``positions`` (sorted), each attending every token before it, in
    budget-sized batches; contiguous positions cost exactly :func:`prefill_s`."""
    t = 0.0
    for i in range(0, len(positions), budget):
        b = positions[i:i + budget]
        t += st.cost(1, len(b), b[0], float(sum(b) + len(b))).total_s
    return t


def run_case(p: NonPrefixReuseParams, case: str, seed: int,
             ratios: tuple[float, ...]) -> dict[str, Any]:
    rng = np.random.default_rng([seed, 9, CASES.index(case)])
    pool = [rng.integers(1, VOCAB, size=p.doc_len).tolist() for _ in range(p.pool_docs)]
    pre = rng.integers(1, VOCAB, size=p.preamble_len).tolist()
    earlier, prompt = build_case(p, case, rng, pool, pre)
    st = StepTimeModel.preset(p.model, p.gpu)
    c = TierCosts(chunk_tokens=p.chunk_tokens, pcie_bw=p.pcie_gbps * 1e9)
    n = len(prompt)
    out: dict[str, Any] = {"case": case, "seed": seed, "prompt_len": n}
    out["full"] = {"ttft": prefill_s(st, n), "recomputed": n, "reused": 0, "bytes": 0}
    exact = make_stack(p.model, c, remote=False)
    exact.save(earlier)
    r = exact.retrieve(prompt)
    out["prefix"] = {"ttft": r.load_s + prefill_s(st, n - r.hit_tokens, r.hit_tokens),
                     "recomputed": n - r.hit_tokens, "reused": r.hit_tokens,
                     "bytes": r.h2d_bytes}
    # blend: the exact prefix as above (its KV is exact), then chunks found by content among the
    # documents saved alone, each reused with a fraction of its tokens recomputed
    saved = {k for d in [pre, *pool] for k in content_keys(d, p.chunk_tokens)}
    ch, first = p.chunk_tokens, r.hit_tokens // p.chunk_tokens
    last = (n - 1) // ch
    found = [first + i for i, k in enumerate(content_keys(prompt, ch)[first:last]) if k in saved]
    blended = [j * ch + o for j in found for o in range(ch)]
    fresh = sorted(set(range(r.hit_tokens, n)) - set(blended))
    load = r.load_s + len(found) * (c.pcie_op_s + exact.chunk_bytes / c.pcie_bw)
    out["blend"] = {}
    for ratio in ratios:
        m = math.ceil(ratio * len(blended))
        pick = [blended[i] for i in np.linspace(0, len(blended) - 1, m).astype(int)] if m else []
        q = sorted(set(fresh) | set(pick))
        out["blend"][ratio] = {"ttft": load + positions_prefill(st, q), "recomputed": len(q),
                               "reused": n - len(q), "blended": len(blended),
                               "bytes": r.h2d_bytes + len(found) * exact.chunk_bytes}
    return out


def sweep(p: NonPrefixReuseParams, progress: Progress | None = None) -> dict[str, Any]:
    n = p.repeats if p.repeats is not None else (2 if p.quick else 3)
    seeds = [p.seed + i for i in range(n)]
    ratios = tuple(dict.fromkeys((*p.sweep_ratios, p.recompute_ratio)))
    order = [(c, s) for i, s in enumerate(seeds) for c in (CASES if i % 2 == 0 else CASES[::-1])]
    runs: dict[str, dict[int, dict]] = {c: {} for c in CASES}
    for k, (c, s) in enumerate(order):
        runs[c][s] = run_case(p, c, s, ratios)
        if progress:
            progress(k + 1, len(order), f"{c} seed {s}")
    return {"seeds": seeds, "order": [f"{c}/{s}" for c, s in order], "runs": runs,
            "ratios": ratios, "quality": None}


