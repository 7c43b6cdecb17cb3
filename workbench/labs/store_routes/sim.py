"""Store routes (seed 003 E6; Mooncake Store and LMCache modelled, not measured): route A, the
engine's store connector straight to the store; route B, the engine through a cache layer
(LMCache-style, with its pinned-DRAM tier) to the same store.

Two vLLM-like instances share one remote store (:class:`workbench.tiers.RemoteStore`: a metadata
service and a transfer path). Prefix caching is off on both, so every hit is external. Four
scenarios, after the seed: *miss* (cold documents: lookups that find nothing, then saves), *warm*
(instance 1 writes, instance 2 reads: cross-instance reads), *hotspot* (a few documents read
again and again by both instances) and *pressure* (more documents than the store holds: LRU
evicts, later reads miss). Per route and scenario: metadata requests, payload bytes, effective
bandwidth, store use and evictions, TTFT.

By default the routes differ in one thing, the cache layer's DRAM tier (same chunk, same
metadata batching); ``direct_chunk`` and ``direct_meta_batch`` let a learner add the
configuration differences the seed warns about, which must be reported before any result is
blamed on "one more layer".
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from workbench.engines.models import get_model
from workbench.engines.sched.request import Request
from workbench.engines.sim.kvsetup import static_pool
from workbench.engines.sim.steptime import StepTimeModel
from workbench.engines.sim.vllm_like import VLLMLikeEngine, VLLMOptions
from workbench.engines.sim.workloads import VOCAB
from workbench.labs.kit.base import Progress
from workbench.tiers import TierCosts, make_stack, make_store
from workbench.tiers.sim import TierConnector
from workbench.units import GiB

if TYPE_CHECKING:
    from workbench.labs.store_routes.params import StoreRoutesParams

ROUTES = ("direct", "via-cache")
SCENARIOS = ("miss", "warm", "hotspot", "pressure")


def _costs(p: StoreRoutesParams, route: str, store_docs: int | None) -> TierCosts:
    direct = route == "direct"
    chunk = p.direct_chunk if direct and p.direct_chunk else p.chunk_tokens
    batch = p.direct_meta_batch if direct and p.direct_meta_batch is not None else p.meta_batch
    kvb = get_model(p.model).kv_bytes_per_token
    doc_bytes = (p.doc_len // chunk) * chunk * kvb
    c = TierCosts(chunk_tokens=chunk, remote_bw=p.remote_gbps * 1e9, meta_s=p.meta_ms * 1e-3,
                  meta_batch=batch, dram_bytes=p.dram_docs * doc_bytes)
    return replace(c, remote_bytes=store_docs * doc_bytes) if store_docs else c


def plan_requests(p: StoreRoutesParams, scenario: str, seed: int) -> list[tuple[str, Request]]:
    """(instance, request) in arrival order; ``group`` is ``write:k`` or ``read:k`` (doc k)."""
    rng = np.random.default_rng([seed, 6, SCENARIOS.index(scenario)])
    docs = [rng.integers(1, VOCAB, size=p.doc_len).tolist() for _ in range(p.docs)]
    q = lambda: rng.integers(1, VOCAB, size=p.question_len).tolist()  # noqa: E731
    steps: list[tuple[str, str, int]] = []
    if scenario == "miss":
        steps = [("i1", "write", k) for k in range(p.docs)]
    elif scenario == "warm":
        steps = [("i1", "write", k) for k in range(p.docs)] + \
                [("i2", "read", k) for k in range(p.docs)]
    elif scenario == "pressure":  # newest first: LRU kept the newest; write order would thrash
        steps = [("i1", "write", k) for k in range(p.docs)] + \
                [("i2", "read", k) for k in reversed(range(p.docs))]
    else:  # hotspot
        steps = [("i1", "write", k) for k in range(p.hot_docs)] + \
                [(("i1", "i2")[int(rng.integers(2))], "read", int(rng.integers(p.hot_docs)))
                 for _ in range(p.hot_reads)]
    return [(inst, Request(i, docs[k] + q(), p.output_len, i * p.spacing_s, f"{phase}:{k}"))
            for i, (inst, phase, k) in enumerate(steps)]


def run_case(p: StoreRoutesParams, route: str, scenario: str, seed: int) -> dict[str, Any]:
    env = simpy.Environment()
    spec = get_model(p.model)
    st = StepTimeModel.preset(p.model, p.gpu)
    c = _costs(p, route, p.store_docs if scenario == "pressure" else None)
    store = make_store(p.model, c)
    conns, engines = {}, {}
    for name in ("i1", "i2"):
        conns[name] = TierConnector(make_stack(p.model, c, store=store, owner=name,
                                               dram=route == "via-cache"))
        engines[name] = VLLMLikeEngine(env, name, static_pool(spec, 40 * GiB, name=name), st,
                                       options=VLLMOptions(), connector=conns[name])
    plan = plan_requests(p, scenario, seed)
    for name, eng in engines.items():
        eng.submit([r for i, r in plan if i == name])
    env.run(until=len(plan) * p.spacing_s + 30)
    rows = []
    for inst, r in plan:
        ld, sv = conns[inst].loads[r.rid], conns[inst].saves.get(r.rid)
        rows.append({"rid": r.rid, "instance": inst, "phase": r.group.split(":")[0],
                     "doc": int(r.group.split(":")[1]), "ttft": r.first_token - r.arrival,
                     "hit": ld.new_tokens, "chunks": dict(ld.chunks),
                     "cross_instance_chunks": ld.cross_instance_chunks,
                     "lookup_s": ld.lookup_s, "retrieve_s": ld.retrieve_s, "h2d_s": ld.h2d_s,
                     "read_meta": ld.metadata_requests, "read_bytes": ld.payload_bytes,
                     "h2d_bytes": ld.h2d_bytes,
                     "write_meta": sv.metadata_requests if sv else 0,
                     "write_bytes": sv.payload_bytes if sv else 0})
    return {"route": route, "scenario": scenario, "seed": seed, "rows": rows,
            "chunk_tokens": c.chunk_tokens, "meta_batch": c.meta_batch,
            "store": {"metadata_requests": store.metadata_requests,
                      "metadata_s": store.metadata_s, "transfer_s": store.transfer_s,
                      "payload_read": store.payload_read,
                      "payload_written": store.payload_written, "evictions": store.evictions,
                      "used_bytes": store.used_bytes, "capacity_bytes": store.spec.capacity_bytes,
                      "chunk_bytes": store.chunk_bytes}}


def sweep(p: StoreRoutesParams, progress: Progress | None = None) -> dict[str, Any]:
    n = p.repeats if p.repeats is not None else (2 if p.quick else 3)
    seeds = [p.seed + i for i in range(n)]
    cases = [(r, s) for r in ROUTES for s in SCENARIOS]
    order = [(r, sc, sd) for i, sd in enumerate(seeds)
             for r, sc in (cases if i % 2 == 0 else cases[::-1])]
    runs: dict[str, dict[str, dict[int, dict]]] = {r: {s: {} for s in SCENARIOS} for r in ROUTES}
    for k, (r, sc, sd) in enumerate(order):
        runs[r][sc][sd] = run_case(p, r, sc, sd)
        if progress:
            progress(k + 1, len(order), f"{r} {sc} seed {sd}")
    return {"seeds": seeds, "order": [f"{r}/{sc}/{sd}" for r, sc, sd in order], "runs": runs}


