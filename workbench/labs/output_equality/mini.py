"""The output-equality lab's runs: every case against its own reference, over the seeds, the case
order reversed on odd seeds (seed 003 §2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.labs.kit.base import Progress
from workbench.labs.output_equality.lab import WRONG_LAYOUTS, Bench, OutputEqualityParams, make_prompts

# The registry model's decoder with wider KV heads (4 KiB of K or V per token and layer: 512
# tokens a 2 MiB page), and for the recycling case prompts long enough that one wave spans
# several pages, so pages really are unmapped and mapped again; the tiny model's own 512-byte
# tokens would all sit on page 0.
WIDE = {"num_heads": 8, "num_kv_heads": 8, "head_dim": 256}
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

    device = {"host": "cpu", "gpu": "cuda"}.get(backend, backend)
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
    tight = (longest + 1 + SPARE) * 16 * bench.cfg.kv_token_bytes
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
