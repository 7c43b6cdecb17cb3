"""Measurements of the kv-capacity lab (seed 003 E2): the seed's capacity formula, the pools the
simulated engines really build, and the rules that reconcile the two.

The seed's prediction is vLLM's: KV budget = ``utilization * device - weights - activations``;
one token's KV = ``layers * buffers * kv_heads * head_dim * dtype`` bytes (2 buffers, K and V, for
MHA/GQA; one latent buffer for MLA); blocks = budget // (block_size * token bytes). The pool
differs from that by rules the geometry states (:mod:`workbench.core.geometry`):

* **page floor**: a pool holds whole page ids (one 2 MiB page per layer per buffer); the budget's
  remainder below one page id holds no block;
* **unaddressed pages**: a static split sizes its block count as ``pages * floor(page / block)``,
  but block ids are numbered by byte offset, so where blocks straddle page boundaries (MLA) that
  count ends before the last page ids of the split;
* **straddlers**: a block that would cross a page boundary is never handed out;
* **null block**: block 0 is reserved (the engines' padding block).

Each rule is computed from the geometry alone; the measured number comes from allocating the pool
until it misses. The lab checks that prediction minus the rules equals the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core.device import Device
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.engines.models import ModelSpec, get_model
from workbench.engines.sim.kvsetup import elastic_pool, static_pool
from workbench.errors import ConfigError
from workbench.units import GiB


@dataclass(frozen=True, slots=True)
class CapacityCase:
    """One pool to build: one factor of the table changes at a time."""

    model: str
    mem_gib: float
    block_size: int
    layout: str  # "contiguous" | "per_layer"
    mode: str  # "static" (vLLM's own split) | "elastic" (a KVCacheD pool)
    utilization: float  # static: gpu_memory_utilization; elastic: kvcached gpu_utilization
    activation_gib: float


def kv_budget(spec: ModelSpec, case: CapacityCase) -> int:
    """Bytes of KV the seed's formula allows: ``util * device - weights - activations``."""
    mem = int(case.mem_gib * GiB)
    act = int(case.activation_gib * GiB)
    if case.mode == "static":
        return int(case.utilization * mem) - spec.weight_bytes - act
    # elastic: the pool may map until (1 - gpu_utilization) of the device is left free
    return mem - spec.weight_bytes - act - int(mem * (1.0 - case.utilization))


def fill(kv: KVCacheManager) -> int:
    """Allocate until the ledger misses; the number of blocks it really handed out.

    Where blocks divide the page, one call for what the ledger advertises; otherwise (it can
    over-promise there, see the lab's notes) a page's worth at a time, then single blocks, so a
    miss rolls back little (a rollback unmaps every page the call had mapped)."""
    g = kv.geometry
    if g.page_size % g.block_bytes == 0:
        first = kv.alloc(kv.available_size())
        if first is not None:
            return len(first) + fill_rest(kv, 1)
    return fill_rest(kv, max(1, g.page_size // g.block_bytes))


def fill_rest(kv: KVCacheManager, chunk: int) -> int:
    got = 0
    while chunk:
        ids = kv.alloc(chunk)
        if ids is None:
            chunk = 1 if chunk > 1 else 0
            continue
        got += len(ids)
    return got


def whole_blocks(g: KVGeometry, pages: int) -> int:
    """Blocks the ledger can hand out on page ids ``0..pages-1`` (null block included)."""
    return sum(g.blocks_per_page(p) for p in range(min(pages, g.num_pages)))


def build(case: CapacityCase) -> tuple[KVCacheManager, Device | None]:
    spec = get_model(case.model)
    cfg = PoolConfig(contiguous_layout=case.layout == "contiguous")
    if case.mode == "static":
        return static_pool(spec, kv_budget(spec, case), name="static", block_size=case.block_size,
                           config=cfg).kv, None
    mem = int(case.mem_gib * GiB)
    dev = make_device("sim", preset="a100", capacity=mem)
    dev.occupy("weights+activations", spec.weight_bytes + int(case.activation_gib * GiB))
    cfg = PoolConfig(contiguous_layout=cfg.contiguous_layout, gpu_utilization=case.utilization)
    return elastic_pool(spec, dev, name="elastic", block_size=case.block_size, config=cfg).kv, dev


def measure(case: CapacityCase) -> dict:
    """The seed's prediction, the rules, and what the pool really gives, for one case."""
    spec = get_model(case.model)
    budget = kv_budget(spec, case)
    row: dict = {"model": case.model, "mla": spec.mla, "mem_gib": case.mem_gib,
                 "block_size": case.block_size, "layout": case.layout, "mode": case.mode,
                 "utilization": case.utilization, "kv_budget_bytes": budget,
                 "token_bytes": spec.kv_bytes_per_token}
    probe = spec.geometry(2, case.block_size)
    if budget < probe.page_id_bytes:
        return {**row, "fits": False}
    try:
        kv, dev = build(case)
    except ConfigError as err:  # the pool refuses the case (too small): say so in the table
        return {**row, "fits": False, "why": str(err).splitlines()[0]}
    g = kv.geometry
    block_all = case.block_size * spec.kv_bytes_per_token  # one block across every layer
    pred_blocks = budget // block_all
    budget_pages = budget // g.page_id_bytes
    addressed = min(budget_pages, g.num_pages)
    page_floor = pred_blocks - budget_pages * g.page_size // g.block_bytes
    unaddressed = (budget_pages * g.page_size // g.block_bytes
                   - addressed * g.page_size // g.block_bytes)
    straddle = addressed * g.page_size // g.block_bytes - whole_blocks(g, addressed)
    explained = pred_blocks - page_floor - unaddressed - straddle - 1
    mapped_idle = kv.pages.mapped_pages
    advertised = kv.available_size()
    allocatable = fill(kv)
    maps = len(dev.mappings) if dev is not None else kv.pages.mapped_pages * g.maps_per_page
    return {**row, "fits": True,
            "pred_tokens": budget // spec.kv_bytes_per_token, "pred_blocks": pred_blocks,
            "pred_page_ids": budget_pages, "blocks_per_page": round(g.page_size / g.block_bytes, 2),
            "block_bytes": g.block_bytes, "page_id_bytes": g.page_id_bytes,
            "virtual_blocks": g.num_blocks, "virtual_page_ids": g.num_pages,
            "page_floor_blocks": page_floor, "unaddressed_blocks": unaddressed,
            "unaddressed_page_ids": budget_pages - addressed, "straddle_blocks": straddle,
            "null_blocks": 1, "explained_blocks": explained,
            "advertised_blocks": advertised, "allocatable_blocks": allocatable,
            "token_slots": allocatable * case.block_size,
            "lost_tokens": (pred_blocks - allocatable) * case.block_size,
            "lost_pct": round(100 * (pred_blocks - allocatable) / pred_blocks, 3),
            "mapped_page_ids_idle": mapped_idle, "mapped_bytes_idle": mapped_idle
            * g.page_id_bytes, "mapped_page_ids_full": kv.pages.mapped_pages,
            "maps_per_page": g.maps_per_page, "driver_mappings_full": maps,
            "explains": explained == allocatable}


def concurrency(model: str, block_size: int, kv_bytes: int, lens: tuple[int, ...]) -> list[dict]:
    """Fixed length, as many requests as fit: the naive token formula, the block-rounded rule
    and the count a fresh static pool really admits (whole blocks per request)."""
    spec = get_model(model)
    rows = []
    for n in lens:
        kv = static_pool(spec, kv_bytes, name="conc", block_size=block_size).kv
        usable = kv.available_size()
        per_req = -(-n // block_size)
        admitted = 0
        while kv.alloc(per_req) is not None:
            admitted += 1
        rows.append({"context_tokens": n, "blocks_per_request": per_req,
                     "rounding_tokens": per_req * block_size - n,
                     "naive": kv_bytes // (n * spec.kv_bytes_per_token),
                     "block_rule": usable // per_req, "admitted": admitted})
    return rows


def preemption_sweep(model: str, block_size: int, kv_bytes: int, prompt_len: int,
                     output_len: int, counts: tuple[int, ...], seed: int = 0) -> list[dict]:
    """Fixed length, rising concurrency on the vLLM-like engine: ``n`` requests arrive together
    on a static pool of ``kv_bytes``; preemptions start once their KV no longer fits."""
    import simpy

    from workbench.engines.sim.steptime import StepTimeModel
    from workbench.engines.sim.vllm_like import VLLMLikeEngine, VLLMOptions
    from workbench.engines.sim.workloads import poisson

    spec = get_model(model)
    per_req = -(-(prompt_len + output_len - 1) // block_size)  # the last token is not cached
    rows = []
    for n in counts:
        env = simpy.Environment()
        ikv = static_pool(spec, kv_bytes, name="e2", block_size=block_size, env=env)
        usable = ikv.kv.available_size()
        eng = VLLMLikeEngine(env, "e2", ikv, StepTimeModel.preset(spec, "a100"),
                             options=VLLMOptions(max_num_seqs=1024))
        reqs = poisson(1e9, n, prompt_len=prompt_len, output_len=output_len, seed=seed)
        for r in reqs:
            r.arrival = 0.0  # all at once: concurrency n
        eng.submit(reqs)
        eng.advance()
        s = eng.metrics()
        rows.append({"concurrency": n, "blocks_per_request": per_req, "usable_blocks": usable,
                     "predicted_max": usable // per_req, "demand_blocks": n * per_req,
                     "preemptions": s.preemptions, "finished": s.finished,
                     "recomputed_tokens": eng.scheduler.stats.recomputed_tokens,
                     "e2e_p50_s": round(s.e2e.p50, 4)})
    return rows


def shared_prefix(model: str, block_size: int, prefix_blocks: int = 4) -> list[dict]:
    """Two requests share ``prefix_blocks`` full blocks (vLLM prefix caching on an elastic pool);
    each ends in turn. Reference counts fall to 0, yet the blocks stay allocated (cached) and
    the pages mapped; only a cache reset frees them, and even then the reserve keeps pages."""
    from workbench.engines.sched.block_pool import BlockPool
    from workbench.engines.sched.request import Request
    from workbench.engines.sched.vllm_sched import VLLMKVManager

    spec = get_model(model)
    dev = make_device("sim", preset="a100", capacity=8 * GiB)
    kv = elastic_pool(spec, dev, name="prefix", block_size=block_size).kv
    kvm = VLLMKVManager(BlockPool(kv, enable_caching=True))
    pool = kvm.pool
    prefix = list(range(1, prefix_blocks * block_size + 1))
    a = Request(1, prefix + [9001] * 5, 8)
    b = Request(2, prefix + [9002] * 7, 8)
    rows: list[dict] = []

    def note(step: str, shared: list[int]) -> None:
        rows.append({"step": step, "shared_refs": sorted({pool.ref[x] for x in shared}),
                     "used_blocks": kv.used_blocks, "evictable": len(pool.evictable),
                     "in_use_page_ids": kv.pages.mapped_pages - len(kv.pages.reserved),
                     "mapped_page_ids": kv.pages.mapped_pages})

    kvm.allocate_slots(a, a.num_tokens)
    shared = a.blocks[:prefix_blocks]
    note("A admitted", shared)
    hit = kvm.get_computed_blocks(b)
    kvm.allocate_slots(b, b.num_tokens - len(hit) * block_size, hit)
    note(f"B admitted ({len(hit)} blocks hit)", shared)
    kvm.free(a)
    note("A finished", shared)
    kvm.free(b)
    note("B finished", shared)
    pool.reset_prefix_cache()
    note("prefix cache reset", shared)
    return rows
