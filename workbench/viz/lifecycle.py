"""One request through an engine, one step at a time (chapter 05; seed 001 §2, §5).

:func:`build_engine` stacks an engine's objects over a device the caller built with
:func:`workbench.backends.make_device`:

=============  ===============================================================================
device         what steps
=============  ===============================================================================
``sim``        the pure schedulers of :mod:`workbench.engines.sched` (vLLM-like: scheduler →
               KV manager → block pool → ledger; SGLang-like: scheduler → radix cache →
               ledger); no model runs, the scheduler's ``update`` stands in for one
``host``/      ``kind="vllm"``: the mini engine (:mod:`workbench.mini`), the same vLLM-like
``gpu``        scheduler driving a real model whose K/V views lie over this device's pages;
               ``kind="sglang"``: the SGLang-like scheduler over a pool on this device (the
               mini engine has no SGLang-style scheduler, so no model runs there)
=============  ===============================================================================

:class:`SteppedEngine` runs exactly one iteration per :meth:`~SteppedEngine.step` and, with
:meth:`~SteppedEngine.mark`, closes a :class:`~workbench.viz.trace.Recording` step and keeps a
:class:`Snapshot` of what one request holds, so the block table and the page map of every step
can be drawn (:mod:`workbench.viz.walk`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.engines.sched.block_pool import BlockPool
from workbench.engines.sched.radix_cache import RadixCache
from workbench.engines.sched.request import Request
from workbench.engines.sched.scheduler import StepPlan
from workbench.engines.sched.sglang_sched import SGLangScheduler
from workbench.engines.sched.vllm_sched import VLLMKVManager, VLLMScheduler
from workbench.errors import ConfigError
from workbench.viz.trace import Recording

KINDS = ("vllm", "sglang")

# 4 layers x 64 KV heads x 128 dims, bf16: a 16-token block is 256 KiB per layer per buffer, so
# a 2 MiB VMM page holds 8 blocks (128 tokens) and one request visibly spans several pages.
WALK_GEOMETRY = KVGeometry(num_layers=4, kv_heads=64, head_dim=128, block_size=16,
                           num_blocks=16 * 8)


@dataclass(slots=True)
class Snapshot:
    """What one request held after one step (``table``: vLLM block table / SGLang KV pages)."""

    step: int
    label: str
    state: str
    num_tokens: int
    num_computed: int
    table: list[int]
    pages: list[int]  # the VMM page of each table entry, in table order
    hit_tokens: int


@dataclass(slots=True)
class SteppedEngine:
    """One engine instance driven one iteration at a time (see module doc)."""

    kind: str
    scheduler: Any  # VLLMScheduler or SGLangScheduler
    cache: Any  # BlockPool (vLLM) or RadixCache (SGLang)
    kv: KVCacheManager
    rec: Recording
    mini: Any = None  # the mini engine when a real model runs
    last_plan: StepPlan | None = None
    snapshots: list[Snapshot] = field(default_factory=list)
    _next_rid: int = 0
    _clock: float = 0.0

    # -- requests ------------------------------------------------------------------------------
    def submit(self, prompt: list[int], max_new_tokens: int) -> Request:
        """Queue one request (the mini engine's ``add_request`` when a model runs)."""
        if self.mini is not None:
            return self.mini.add_request(prompt, max_new_tokens)
        req = Request(self._next_rid, list(prompt), max_new_tokens)
        self._next_rid += 1
        self.scheduler.add_request(req)
        return req

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # -- one iteration -------------------------------------------------------------------------
    def step(self) -> StepPlan:
        """schedule → (model) → update, once; returns the step's plan."""
        if self.mini is not None:
            self.mini.step()  # its scheduler's schedule() is tapped: see build_engine
            plan = self.last_plan
        else:
            plan = self.scheduler.schedule()
            self._clock += 0.01  # the simulator's stand-in clock: one step, 10 ms
            self.scheduler.update(plan, self._clock)
            self.last_plan = plan
        if plan is None:  # pragma: no cover - the tap always sees a plan
            raise ConfigError("step", "the engine ran no schedule()", "call step() again")
        return plan

    def _tap(self, schedule):
        def tapped() -> StepPlan:
            self.last_plan = schedule()
            return self.last_plan
        return tapped

    # -- observation ---------------------------------------------------------------------------
    def mark(self, req: Request, label: str) -> Snapshot:
        """Close a recording step and keep what ``req`` holds now."""
        step = self.rec.mark(label)
        g = self.kv.geometry
        snap = Snapshot(step, label, req.state.value, req.num_tokens, req.num_computed,
                        list(req.blocks), [g.block_page(b) for b in req.blocks],
                        req.prefix_hit_tokens)
        self.snapshots.append(snap)
        return snap

    def drop_cache(self) -> int:
        """Evict every cached block no request holds (vLLM ``reset_prefix_cache``, SGLang
        radix ``reset``); returns how many."""
        if isinstance(self.cache, BlockPool):
            return self.cache.reset_prefix_cache()
        return self.cache.reset() // self.cache.page  # reset() counts tokens

    def chain(self) -> list[str]:
        """The object chain from the scheduler down to the device, from the live objects."""
        names = []
        if self.mini is not None:
            names.append("mini Engine (model + paged attention)")
        names.append(type(self.scheduler).__name__)
        if isinstance(self.scheduler, VLLMScheduler):
            names.append(type(self.scheduler.kvm).__name__)
        names += [type(self.cache).__name__, type(self.kv).__name__,
                  type(self.kv.pages).__name__, type(self.kv.space).__name__,
                  type(self.kv.device).__name__]
        return names


# what each workbench object stands for upstream; vLLM and kvcached both have a KVCacheManager,
# one above the block pool and one below it, so the chain names which is which
UPSTREAM = {
    "VLLMScheduler": "vLLM Scheduler",
    "VLLMKVManager": "vLLM KVCacheManager with its KVCacheCoordinator folded in (one KV group)",
    "BlockPool": "vLLM BlockPool (elastic: its block ids come from the ledger below)",
    "SGLangScheduler": "SGLang Scheduler",
    "RadixCache": "SGLang RadixCache (holds the token allocator; alloc_token_slots allocates)",
    "KVCacheManager": "the elastic layer's block ledger (kvcached's KVCacheManager)",
    "PageAllocator": "the elastic layer's page allocator",
    "KVSpace": "the reserved virtual range and its tensor views",
}


def roles(engine: SteppedEngine) -> list[tuple[str, str]]:
    """(workbench object, what it stands for upstream) down the chain; a device is the driver."""
    return [(n, UPSTREAM.get(n, "the device: the driver's VMM calls")) for n in engine.chain()]


def _pool(device, rec: Recording, geometry: KVGeometry) -> KVCacheManager:
    # no background refill and a reserve of one page: every map and park shows in the page map
    cfg = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=1)
    kv = KVCacheManager(geometry, device, name="pool", config=cfg, events=rec.log)
    rec.add_pool(kv)
    return kv


def build_engine(kind: str, device, *, budget: int = 64, prefix_caching: bool = True,
                 geometry: KVGeometry = WALK_GEOMETRY) -> SteppedEngine:
    """An engine of ``kind`` over ``device`` (see module doc); ``budget`` is the token budget of
    one step (vLLM ``max_num_batched_tokens``; SGLang prefill budget and chunk size)."""
    if kind not in KINDS:
        raise ConfigError(f"engine kind {kind!r}", "this chapter steps two engines",
                          f"use one of {', '.join(KINDS)}")
    if kind in REAL_TOKENS and device.torch_device is not None:  # real memory: real tokens
        return _mini_engine(device, budget=budget, prefix_caching=prefix_caching)
    rec = Recording()
    kv = _pool(device, rec, geometry)
    sched, cache = STEPPED[kind](kv, budget, prefix_caching)
    return SteppedEngine(kind, sched, cache, kv, rec)


def _vllm_stepped(kv: KVCacheManager, budget: int, prefix_caching: bool):
    pool = BlockPool(kv, enable_caching=prefix_caching)
    return VLLMScheduler(VLLMKVManager(pool), max_num_batched_tokens=budget), pool


def _sglang_stepped(kv: KVCacheManager, budget: int, prefix_caching: bool):
    cache = RadixCache(kv, enable_caching=prefix_caching)
    # run_blocks=0: each allocation is exactly what the step needs (as seed 001 §5 tells it)
    return SGLangScheduler(cache, max_prefill_tokens=budget, chunked_prefill_size=budget,
                           run_blocks=0), cache


STEPPED = {"vllm": _vllm_stepped, "sglang": _sglang_stepped}  # kind -> (scheduler, its cache)
REAL_TOKENS = ("vllm",)  # on real memory: the mini engine (it schedules like vLLM)


def _mini_engine(device, *, budget: int, prefix_caching: bool) -> SteppedEngine:
    """The mini engine (tiny Llama-shaped model) with its KV views over ``device``'s pages."""
    import torch

    from workbench.mini.engine import Engine, EngineConfig
    from workbench.mini.kv import KVSpec
    from workbench.mini.model import get_config

    torch_dev = torch.device(device.torch_device)  # the device says where its memory is
    spec = KVSpec(style="block", backend="vmm", kv_bytes=64 << 20, block_size=16)
    eng = Engine(get_config("tiny"), spec, torch_dev, pool_device=device, name="pool",
                 cfg=EngineConfig(max_batched_tokens=budget, prefix_caching=prefix_caching))
    kv = eng.kv.manager
    rec = Recording(log=kv.events)
    rec.add_pool(kv)
    out = SteppedEngine("vllm", eng.scheduler, eng.pool, kv, rec, mini=eng)
    # the engine calls its scheduler's schedule() inside step(); keep the plan it returns
    eng.scheduler.schedule = out._tap(eng.scheduler.schedule)
    return out


def describe_step(plan: StepPlan, req: Request, before: list[int]) -> str:
    """One line: what this step did to ``req`` (its tokens, new blocks, finish)."""
    mine = next((n for r, n in plan.items if r is req), 0)
    what = ("prefill" if mine > 1 or req.output_len == 0 else "decode") if mine else "waits"
    old = set(before)
    new = [b for b in req.blocks if b not in old]
    parts = [f"{plan.kind} batch of {plan.num_seqs}", f"ours: {what}"
             + (f" {mine} tok" if mine else "")]
    if req.prefix_hit_tokens and not before and req.blocks:
        parts.append(f"prefix hit {req.prefix_hit_tokens} tok")
    if new:
        parts.append(f"+{len(new)} block(s)")
    if req.state.value == "finished":
        parts.append("finished: blocks released")
    return " · ".join(parts)


def prompt_tokens(n: int, *, salt: int = 0) -> list[int]:
    """A deterministic prompt of ``n`` token ids (1..500: inside the tiny model's vocabulary)."""
    return [(i * 7 + 3 + salt * 131) % 500 + 1 for i in range(n)]


def walk_table(snaps: list[Snapshot]) -> str:
    """The walk as text: one row per step."""
    rows = [f"{'step':>4}  {'state':<8} {'KV':>9}  {'table (block ids)':<30} pages   what"]
    for s in snaps:
        table = ",".join(map(str, s.table))
        if len(table) > 30:
            table = table[:27] + "..."
        pages = ",".join(map(str, sorted(set(s.pages)))) or "-"
        rows.append(f"{s.step:>4}  {s.state:<8} {s.num_computed:>4}/{s.num_tokens:<4}  "
                    f"{table:<30} {pages:<7} {s.label}")
    return "\n".join(rows)
