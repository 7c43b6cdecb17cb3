"""Idle footprint on a real vLLM: after a prefix-heavy wave ends, what the real prefix cache
pins (cached blocks are held, so their pages stay mapped), against the packed floor.

Two elastic engines serve the same wave: one with the cache unbounded (vLLM's own setting: a
cached block stays until vLLM reuses its id), one under ``max_cached_tokens``, where the
adapter evicts least recently freed blocks first (its only order: ``ElasticBlockPool``'s
``_enforce_cache_bound``). The adapter has no page-aware eviction, so that variant is the
simulator's alone (:func:`sim_gap`). The unbounded engine then gets vLLM's own
``/reset_prefix_cache`` (dev mode): the one call that gives an idle engine's cached pages back.
The reserve is 0 pages so mapped memory is what the blocks pin.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from typing import Any

from workbench.engines.sched.request import Request
from workbench.labs.kit import server_rig as rig

BOUND_TOKENS = 1536  # the LRU engine's max_cached_tokens (48 blocks of 32 tokens on the CPU)


def wave(n: int, seed: int, groups: int = 4) -> list[tuple[list[int], int]]:
    """``n`` (prompt, output tokens): one of ``groups`` shared prefixes (128-224 tokens), its
    own suffix (32-96) and 16-64 output tokens -- the sim's prefix-heavy mix, scaled to the
    tiny model's 512-token context."""
    rng = random.Random(seed)

    def tok(k: int) -> list[int]:
        return [rng.randrange(rig.VOCAB_LO, rig.VOCAB_HI) for _ in range(k)]

    heads = [tok(rng.randrange(128, 225)) for _ in range(groups)]
    return [(heads[rng.randrange(groups)] + tok(rng.randrange(32, 97)), rng.randrange(16, 65))
            for _ in range(n)]


def _serve(eng, work: list[tuple[list[int], int]]) -> dict[str, int]:
    reqs = [Request(rid=i, prompt=p, max_new_tokens=k) for i, (p, k) in enumerate(work)]
    eng.submit(reqs)
    eng.advance()
    outs = [eng.outcome(r.rid) for r in reqs]
    return {"requests": len(reqs), "finished": sum(
        1 for o, r in zip(outs, reqs, strict=True)
        if not o.error and len(o.token_ids) == r.max_new_tokens)}


def footprint(eng, bpp: int) -> dict[str, Any]:
    """The idle pool from its segment: held (cached) blocks, pages in use, the packed floor."""
    i = eng.kv_pool.info()
    page = i.page_id_bytes
    floor = math.ceil((i.used_blocks + 1) / bpp)  # + the null block
    return {"mapped": i.mapped, "used": i.used, "reserved": i.reserved,
            "cached_blocks": i.used_blocks, "in_use_pages": i.used // page,
            "reserved_pages": i.reserved // page, "floor_pages": floor,
            "ratio_in_use": round(i.used / page / floor, 3),
            "ratio_mapped": round(i.mapped / page / floor, 3)}


def reset_prefix_cache(eng) -> dict[str, Any]:
    """vLLM's ``POST /reset_prefix_cache`` (dev mode), then the segment once it settled."""
    import httpx

    try:
        r = httpx.post(eng.url + "/reset_prefix_cache", timeout=30)
    except httpx.HTTPError as err:
        return {"offered": False, "detail": str(err)[:200]}
    if r.status_code != 200:
        return {"offered": False, "detail": f"HTTP {r.status_code}"}
    time.sleep(0.5)
    i = eng.kv_pool.info()
    return {"offered": True, "mapped": i.mapped, "used": i.used, "cached_blocks": i.used_blocks}


def sim_gap(quick: bool, seed: int) -> dict[str, Any]:
    """The simulator's page-aware against LRU (vLLM-like engine), the quick size."""
    from workbench.labs.idle_footprint.sim import measure

    n = 500 if quick else 2500
    pa, lru = (measure("vllm", page_aware=x, num_requests=n, seed=seed) for x in (True, False))
    return {"requests": n, "page_aware": pa["ratio_in_use"], "lru": lru["ratio_in_use"],
            "page_aware_pages": pa["in_use_pages"], "lru_pages": lru["in_use_pages"],
            "floor_pages": pa["floor_pages"]}


def _dev_mode(eng) -> None:
    """vLLM serves ``/reset_prefix_cache`` only with ``VLLM_SERVER_DEV_MODE=1``."""
    base = eng.env
    eng.env = lambda: {**base(), "VLLM_SERVER_DEV_MODE": "1"}


def run(backend: str, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    py = rig.python_for("idle-footprint")
    root = rig.workroot()
    dev = rig.device_of(backend)
    reserve = {"min_reserved_pages": "0", "max_reserved_pages": "0"}
    engines: list = []
    try:
        model = rig.model_dir(py, root)
        engines = [rig.engine("if-unbounded", backend, model, py, root, elastic=True,
                              knobs={**reserve, "max_cached_tokens": "-1"}),
                   rig.engine("if-lru", backend, model, py, root, elastic=True,
                              knobs={**reserve, "max_cached_tokens": str(BOUND_TOKENS)})]
        _dev_mode(engines[0])
        rig.start_all(engines)
        work = wave(48 if quick else 128, seed)
        rows = []
        for e in engines:
            info = e.kv_pool.info()
            size, bpp = rig.blocks_per_page(e, info.page_id_bytes)
            served = _serve(e, work)
            time.sleep(1.0)  # idle: every request has ended
            c = rig.counters(e)
            rows.append({"engine": e.name, "eviction": "none (unbounded)" if e is engines[0]
                         else "LRU (least recently freed)", "max_cached_tokens":
                         -1 if e is engines[0] else BOUND_TOKENS, "bound_blocks": -1
                         if e is engines[0] else BOUND_TOKENS // size, **served,
                         "blocks_per_page": bpp, "page_id_bytes": info.page_id_bytes,
                         "block_size": size, **footprint(e, bpp),
                         "prefix_hit_tokens": int(c.get("prefix_cache_hits", 0)),
                         "prefix_query_tokens": int(c.get("prefix_cache_queries", 0))})
        rows[0]["after_reset"] = reset_prefix_cache(engines[0])
    finally:
        for e in engines:
            e.close()
        shutil.rmtree(root, ignore_errors=True)
    return {"backend": backend, "device": dev, "rows": rows, "sim": sim_gap(quick, seed),
            "page_aware_in_adapter": False}
