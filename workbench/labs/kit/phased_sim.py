"""Shared by the phase labs (grow-reclaim, same-engine-pair, cross-engine): simulated instances on
one device, each fed its own phased traffic (:func:`workbench.engines.sim.workloads.phased`), with
a fine page-state timeline per instance and a watch on every unmap.

The device's KV headroom is set by a *ballast* (memory held outside every pool, like another
tenant's weights), so a lab can make the instances contend for a few GiB instead of a whole
A100. A graceful shutdown waits until its instance has no work, then closes its pool (every page
unmapped), as a process exiting cleanly would.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import simpy

from workbench.config import PoolConfig
from workbench.core.events import Event, PageState
from workbench.engines.metrics import SLO, summarize
from workbench.engines.sched.request import Request
from workbench.engines.sim.cluster import ClusterConfig, build_cluster
from workbench.engines.sim.engine import SimEngine
from workbench.engines.sim.sglang_like import SGLangOptions
from workbench.engines.sim.vllm_like import VLLMOptions
from workbench.engines.sim.workloads import Phase, PhaseWindow, phased
from workbench.units import GiB

UNMAPPED = (PageState.FREE.value, PageState.RECLAIMED.value)
MAPPED = (PageState.IN_USE.value, PageState.RESERVED.value, PageState.RETIRED.value)


@dataclass(slots=True)
class InstanceSpec:
    kind: str  # "vllm" | "sglang"
    phases: list[Phase]
    shutdown_after: float | None = None  # graceful shutdown: close once idle after this time
    traffic_seed: int | None = None  # None: the run's seed * 100 + the instance's index
    requests: list[Request] | None = None  # explicit traffic; the phases then only name windows


@dataclass(slots=True)
class RunSpec:
    instances: list[InstanceSpec]
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    kv_budget_gib: float | None = 8.0  # KV the pools may map together (None: the whole device)
    pool: PoolConfig = field(default_factory=PoolConfig)
    vllm: VLLMOptions = field(default_factory=VLLMOptions)
    sglang: SGLangOptions = field(default_factory=SGLangOptions)
    sample_every_s: float = 0.1
    seed: int = 0


@dataclass(slots=True)
class UnmapWatch:
    """Checks every page that leaves IN_USE (parked, retired or unmapped) or leaves the mapped
    states: none may hold a live block. Counts the unmaps and parks it saw."""

    engines: dict[str, SimEngine]
    unmaps: int = 0
    parks: int = 0
    live_unmaps: list[dict] = field(default_factory=list)  # must stay empty
    shutdown: set[str] = field(default_factory=set)  # pools whose close() unmaps in-use pages

    def __call__(self, e: Event) -> None:
        leaves_use = e.src == PageState.IN_USE.value and e.dst != e.src
        unmapped = e.src in MAPPED and e.dst in UNMAPPED
        if not (leaves_use or unmapped) or e.pool in self.shutdown:
            return
        self.unmaps += unmapped
        self.parks += e.dst == PageState.RESERVED.value
        kv = self.engines[e.pool].kv
        live = kv.allocated.union(kv.reserved_blocks).intersection(kv.geometry.page_blocks(e.page))
        if live:
            self.live_unmaps.append({"t": e.t, "pool": e.pool, "page": e.page, "to": e.dst,
                                     "live_blocks": len(live)})


# per scheduler: the blocks (or SGLang pages) its prefix cache holds that no request
# references, and (the counter of its cache's evictions, tokens per unit it counts)
CACHED: dict[str, Callable[[Any], int]] = {
    "vllm": lambda eng: len(eng.pool.evictable),
    "sglang": lambda eng: eng.cache.evictable_size // eng.cache.page}
EVICTIONS: dict[str, Callable[[Any], tuple[Any, int]]] = {
    "vllm": lambda eng: (eng.pool, eng.kv.geometry.block_size),  # vLLM counts blocks
    "sglang": lambda eng: (eng.cache, 1)}


def cached_blocks(eng: SimEngine) -> int:
    """Blocks (or SGLang pages) the prefix cache holds that no request references."""
    return CACHED[eng.kind](eng)


def _sample(env: simpy.Environment, engines: list[SimEngine], out: dict[str, dict[str, list]],
            device) -> None:
    free = device.mem_info().free
    for eng in engines:
        kv, d = eng.kv, out[eng.name]
        c = kv.pages.counts
        for key, value in (("t", env.now), ("in_use_pages", c[PageState.IN_USE]),
                           ("reserved_pages", c[PageState.RESERVED]),
                           ("mapped_bytes", kv.mapped_bytes), ("used_blocks", kv.used_blocks),
                           ("cached_blocks", cached_blocks(eng)),
                           ("running", len(eng.scheduler.running)),
                           ("waiting", len(eng.scheduler.waiting)),
                           ("device_free_bytes", free)):
            d[key].append(value)


def _sampler(env: simpy.Environment, engines: list[SimEngine], out: dict[str, dict[str, list]],
             every_s: float, device):
    while True:
        _sample(env, engines, out, device)
        yield env.timeout(every_s)


def _shutdown(env: simpy.Environment, eng: SimEngine, after: float, watch: UnmapWatch,
              log: dict[str, float]):
    yield env.timeout(after)
    while eng.scheduler.has_work():  # graceful: let the running requests finish
        yield env.timeout(0.05)
    watch.shutdown.add(eng.name)
    log[eng.name] = env.now
    eng.kv.close()


def _ballast(device, engines: list[SimEngine], budget: float | None, util: float) -> int:
    """Hold device memory so the pools can map ``budget`` GiB of KV in all (their mapped pages
    included); returns the ballast's bytes."""
    if budget is None:
        return 0
    free, total = device.mem_info()
    mapped = sum(e.kv.mapped_bytes for e in engines)
    nbytes = free - int(total * (1.0 - util)) - (int(budget * GiB) - mapped)
    nbytes = max(0, nbytes)
    device.occupy("ballast", nbytes)
    return nbytes


def run_phased(spec: RunSpec) -> dict[str, Any]:
    """Run every instance's phases to the end of the longest one; the raw measurements."""
    wall0 = time.perf_counter()
    env = simpy.Environment()
    kinds = tuple(i.kind for i in spec.instances)
    cfg = ClusterConfig(mode="elastic", kinds=kinds, num_instances=len(kinds), model=spec.model,
                        gpu=spec.gpu, pool=spec.pool, vllm=spec.vllm, sglang=spec.sglang,
                        sample_every_s=None, seed=spec.seed)  # type: ignore[arg-type]
    device, engines = build_cluster(cfg, env)
    ballast = _ballast(device, engines, spec.kv_budget_gib, cfg.kv_gpu_utilization)
    watch = UnmapWatch({e.name: e for e in engines})
    windows: dict[str, list[PhaseWindow]] = {}
    shutdowns: dict[str, float] = {}
    stops: list[simpy.Process] = []
    for i, (eng, ispec) in enumerate(zip(engines, spec.instances, strict=True)):
        eng.kv.events.subscribe(watch)
        tseed = ispec.traffic_seed if ispec.traffic_seed is not None else spec.seed * 100 + i
        reqs, windows[eng.name] = phased(ispec.phases, seed=tseed)
        if ispec.requests is not None:
            reqs = ispec.requests
        eng.submit(reqs)
        if ispec.shutdown_after is not None:
            stops.append(env.process(_shutdown(env, eng, ispec.shutdown_after, watch,
                                               shutdowns)))
    timeline = {e.name: {k: [] for k in ("t", "in_use_pages", "reserved_pages", "mapped_bytes",
                                         "used_blocks", "cached_blocks", "running", "waiting",
                                         "device_free_bytes")} for e in engines}
    env.process(_sampler(env, engines, timeline, spec.sample_every_s, device))
    end = max(w[-1].end for w in windows.values())
    env.run(until=end)
    while any(e.has_work() for e in engines):  # a backlog past the last phase: let it drain
        env.run(until=env.now + 1.0)
    for stop in stops:  # a graceful shutdown still waiting for its instance to drain
        if not stop.triggered:
            env.run(until=stop)
    _sample(env, engines, timeline, device)  # the state at the very end
    g = engines[0].kv.geometry
    return {
        "instances": [_instance(e, spec.instances[i], cfg.slo) for i, e in enumerate(engines)],
        "windows": {n: [w._asdict() for w in ws] for n, ws in windows.items()},
        "timeline": timeline, "shutdowns": shutdowns,
        "unmaps": watch.unmaps, "parks": watch.parks, "live_unmaps": watch.live_unmaps,
        "page_id_bytes": g.page_id_bytes, "blocks_per_page": g.page_size // g.block_bytes,
        "block_size": g.block_size, "ballast_bytes": ballast,
        "device_bytes": device.capacity, "kv_budget_bytes": (
            None if spec.kv_budget_gib is None else int(spec.kv_budget_gib * GiB)),
        "min_reserved": spec.pool.min_reserved_pages, "max_reserved": spec.pool.max_reserved_pages,
        "sim_s": env.now, "wall_s": time.perf_counter() - wall0}


def _instance(eng: SimEngine, ispec: InstanceSpec, slo: SLO) -> dict[str, Any]:
    def split() -> dict[str, dict]:
        groups: dict[str, list[Request]] = {}
        for r in eng.submitted:
            groups.setdefault(r.group, []).append(r)
        return {g: summarize(rs, slo).as_dict() for g, rs in groups.items() if g}

    by_group = split()
    phase_names = {ph.name for ph in ispec.phases}
    c, unit = EVICTIONS[eng.kind](eng)  # the cache's evictions, in tokens
    return {"name": eng.name, "kind": eng.kind, "summary": eng.metrics(slo).as_dict(),
            "by_phase": {g: v for g, v in by_group.items() if g in phase_names},
            "by_group": by_group, "stats": eng.scheduler.stats.as_dict(),
            "evicted_tokens": {"cap": c.evicted_cap * unit, "lru": c.evicted_lru * unit},
            "kv_misses": eng.kv.misses, "vmm_s": eng.driver.vmm_s, "steps": eng.driver.steps,
            "requests": [_request(r) for r in eng.submitted]}


def _request(r: Request) -> dict[str, Any]:
    """One request's observations (None where it has none, e.g. never finished)."""
    done = r.finish is not None and r.first_token is not None
    return {"rid": r.rid, "group": r.group, "arrival": r.arrival, "prompt_len": r.prompt_len,
            "hit_tokens": r.prefix_hit_tokens,
            "ttft": None if r.first_token is None else r.first_token - r.arrival,
            "tpot": (r.finish - r.first_token) / (r.output_len - 1)
            if done and r.output_len > 1 else None,
            "e2e": r.finish - r.arrival if done else None,
            "admitted": r.first_scheduled, "finish": r.finish, "preemptions": r.preemptions}


def window_slice(tl: dict[str, list], start: float, end: float) -> dict[str, list]:
    """The samples with ``start <= t < end``."""
    idx = [i for i, t in enumerate(tl["t"]) if start - 1e-9 <= t < end - 1e-9]
    return {k: [v[i] for i in idx] for k, v in tl.items()}


def pages_for(blocks: int, per_page: int) -> int:
    return math.ceil(blocks / per_page)


def with_cache(spec: RunSpec, *, vllm: bool, sglang: bool, vllm_bound: int = -1,
               sglang_bound: int = -1) -> RunSpec:
    """``spec`` with each kind's prefix cache switched and bounded (-1 unlimited)."""
    return replace(spec, vllm=replace(spec.vllm, enable_prefix_caching=vllm,
                                      max_cached_tokens=vllm_bound),
                   sglang=replace(spec.sglang, enable_radix_cache=sglang,
                                  max_cached_tokens=sglang_bound))
