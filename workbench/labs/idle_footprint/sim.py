"""Idle footprint lab: after prefix-heavy traffic, how much memory does an idle instance keep
mapped, against the packed floor (kvcached bench_idle_footprint, research/kvcached.md §6.2)?

Setup like kvcached's bench: Qwen3-4B geometry (36 layers, 64 blocks of 16 tokens per 2 MiB page,
one page id = 144 MiB), cached-token bound 16,000 (1,000 blocks). After the last request the
cache still holds up to the bound; the packed floor is those blocks (plus the null block) packed
into whole pages. kvcached reached 1.4x after its page-aware eviction and best-fit fixes (4.6x
before); the goal here is <= 1.15x. Both eviction policies are run so the difference shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import simpy

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core.events import PageState
from workbench.engines.metrics import summarize
from workbench.engines.models import get_model
from workbench.engines.sim.kvsetup import elastic_pool
from workbench.engines.sim.sglang_like import SGLangLikeEngine, SGLangOptions
from workbench.engines.sim.steptime import StepTimeModel
from workbench.engines.sim.vllm_like import VLLMLikeEngine, VLLMOptions
from workbench.engines.sim.workloads import prefix_heavy
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.record import LabRecord, Manifest

GiB = 1 << 30


@dataclass(slots=True)
class IdleFootprintParams:
    quick: bool = False  # 500 requests instead of 2,500
    seed: int = 0


def measure(engine: str = "vllm", *, page_aware: bool = True, num_requests: int = 2500,
            max_cached_tokens: int = 16000, seed: int = 0, model: str = "qwen3-4b") -> dict:
    env = simpy.Environment()
    spec = get_model(model)
    # an L40-sized device with h200 latencies
    dev = make_device("sim", preset="h200", env=env, capacity=48 * GiB)
    dev.occupy("weights", spec.weight_bytes)
    cfg = PoolConfig(max_cached_tokens=max_cached_tokens)
    ikv = elastic_pool(spec, dev, name=engine, config=cfg)
    st = StepTimeModel.preset(spec, "h200")
    if engine == "vllm":
        eng = VLLMLikeEngine(env, engine, ikv, st, options=VLLMOptions(
            enable_prefix_caching=True, max_num_seqs=96))
        eng.pool.page_aware = page_aware
    else:
        eng = SGLangLikeEngine(env, engine, ikv, st, options=SGLangOptions(max_num_seqs=96))
        eng.cache.page_aware = page_aware
    reqs = prefix_heavy(num_requests, seed=seed)
    eng.submit(reqs)

    def watch():
        while len(eng.scheduler.finished) < len(reqs):
            yield env.timeout(0.5)

    env.run(until=env.process(watch()))
    kv, g = eng.kv, eng.kv.geometry
    bpp = g.page_size // g.block_bytes
    if engine == "vllm":
        cached_blocks = len(eng.pool.evictable)
    else:
        cached_blocks = eng.cache.cached_tokens // eng.cache.page
    c = kv.pages.counts
    in_use, reserved = c[PageState.IN_USE], c[PageState.RESERVED]
    floor = math.ceil((cached_blocks + 1) / bpp)  # + the null block
    s = summarize(reqs, with_itl=False)
    return {"engine": engine, "page_aware": page_aware, "requests": num_requests,
            "cached_blocks": cached_blocks, "blocks_per_page": bpp,
            "in_use_pages": in_use, "reserved_pages": reserved, "floor_pages": floor,
            "page_id_bytes": g.page_id_bytes,
            "ratio_in_use": round(in_use / floor, 3),
            "ratio_mapped": round((in_use + reserved) / floor, 3),
            "prefix_hit_tokens": s.prefix_hit_tokens, "prompt_tokens": s.prompt_tokens,
            "sim_s": env.now}


class IdleFootprintLab(Lab):
    name = "idle-footprint"
    description = ("idle footprint after prefix-heavy traffic vs the packed floor (page-aware vs "
                   "LRU eviction; vLLM-like and SGLang-like)")
    params_type = IdleFootprintParams
    backends = ("sim",)

    def run(self, params: IdleFootprintParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        rows, md = sweep(params.quick, params.seed, progress)
        return LabResult(record(rows, params.seed, backend), md, tables={"rows": rows})


def sweep(quick: bool, seed: int, progress: Progress | None) -> tuple[list[dict], str]:
    n = 500 if quick else 2500
    combos = [(e, pa) for e in ("vllm", "sglang") for pa in (True, False)]
    rows = []
    for i, (e, pa) in enumerate(combos):
        rows.append(measure(e, page_aware=pa, num_requests=n, seed=seed))
        if progress:
            progress(i + 1, len(combos), f"{e} {'page-aware' if pa else 'LRU'}")
    md = ["# Idle footprint after prefix-heavy traffic (simulated)", "",
          f"Qwen3-4B geometry, cap 16,000 tokens, {n} requests. Pages of 144 MiB.", "",
          "| engine | cap eviction | cached blocks | in-use pages | reserved | floor | "
          "in-use / floor | mapped / floor |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['engine']} | {'page-aware' if r['page_aware'] else 'LRU'} | "
                  f"{r['cached_blocks']} | {r['in_use_pages']} | {r['reserved_pages']} | "
                  f"{r['floor_pages']} | {r['ratio_in_use']}x | {r['ratio_mapped']}x |")
    md += ["", "kvcached (L40, vLLM 0.22.1, 2,500 requests): 4.6x before #390, 2.3x with "
           "page-aware eviction, 1.4x with best fit too; our ledger has best fit built in.", "",
           "**Expected shape**: page-aware eviction below LRU for each engine (LRU frees single "
           "blocks scattered over many pages, so few pages empty; page-aware victims empty whole "
           "pages), and page-aware `in-use / floor` at or under the 1.15x goal, below "
           "kvcached's published 1.4x because best fit is always on here. The quick size "
           "(500 requests) fills the same 16,000-token bound, so the ratios keep their order.",
           "`mapped / floor` counts the 5..10 reserved pages a pool keeps parked; kvcached's "
           "idle GB presumably includes them (they are mapped)."]
    return rows, "\n".join(md) + "\n"


def record(rows: list[dict], seed: int, backend: str) -> LabRecord:
    n = rows[0]["requests"]
    spec = get_model("qwen3-4b")
    return LabRecord(
        experiment_id="idle-footprint-qwen3-4b", hypothesis="page-aware eviction under a cached-"
        "token bound keeps the idle footprint within 1.15x of the packed floor",
        environment={"backend": backend, "seed": seed, "requests": n},
        model_io={"model": spec.name, "prompt": "shared prefix 256-1024 + suffix 32-128",
                  "output_tokens": "uniform 16-256"},
        cache_state="prefix cache on, bound 16,000 tokens", load={"arrival": "Poisson 32 req/s"},
        samples={"runs": len(rows)}, outcomes={"finished": n},
        ttft={}, tpot_itl={}, e2e={}, throughput={}, slo_goodput={},
        hits={r["engine"] + ("/pa" if r["page_aware"] else "/lru"):
              {"hit_tokens": r["prefix_hit_tokens"], "prompt_tokens": r["prompt_tokens"]}
              for r in rows},
        transfer_bytes=None, phase_times=None, kv={"rows": rows}, correctness=None,
        raw_data={}, verdict="see rows: ratio_in_use vs 1.15",
        mechanism="pages return only when all their blocks are free; page-aware victims empty "
                  "whole pages, LRU scatters holes",
        open_questions=["closed-loop concurrency 96 approximated by Poisson arrivals"],
        applicability="one instance, idle after a prefix-heavy burst",
        manifest=Manifest.collect(hardware={"gpu": "simulated 48 GiB device (h200 latencies)"},
                                  engine_config={"model": spec.name, "block_size": 16},
                                  kvcached_config={"max_cached_tokens": 16000}),
        results={"rows": rows})
