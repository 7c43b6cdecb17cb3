"""Who owns what across processes (chapter 05; seed 001 §7), run on simulated workers.

* :func:`engine_core_split` — vLLM's split: one scheduler process (EngineCore's role) decides
  which page ids are backed; every TP worker owns its own KV range and applies each decision
  at the same offset, through messages (:class:`~workbench.core.coordinator.FanOutSpace` over
  :class:`~workbench.sim.workers.SimCluster`). Chapter 06 runs the same protocol on real
  worker processes.
* :func:`sglang_ranks` — SGLang's model: every TP rank runs its own scheduler, allocator and
  pool on its own device; nothing is sent between ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config import PoolConfig
from workbench.core.coordinator import FanOutSpace, targets_for
from workbench.core.ledger import KVCacheManager, local_pools
from workbench.engines.sched.block_pool import BlockPool
from workbench.engines.sched.radix_cache import RadixCache
from workbench.engines.sched.request import Request
from workbench.engines.sched.sglang_sched import SGLangScheduler
from workbench.engines.sched.vllm_sched import VLLMKVManager, VLLMScheduler
from workbench.viz.lifecycle import WALK_GEOMETRY, prompt_tokens
from workbench.viz.sequence import Message
from workbench.viz.trace import Recording

# no reserve: a page whose last block goes is unmapped at once, so the unmap shows as messages
NO_RESERVE = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=0)


@dataclass(slots=True)
class SplitResult:
    messages: list[Message]  # times relative to the first message
    participants: list[str]
    worker_pages: dict[str, list[int]]  # what each worker holds mapped at the end
    decisions: int  # page transitions the one scheduler-side allocator made
    rec: Recording


def _run(sched, req: Request, limit: int = 10_000) -> int:
    steps = 0
    sched.add_request(req)
    while sched.has_work() and steps < limit:
        plan = sched.schedule()
        sched.update(plan, 0.01 * (steps + 1))
        steps += 1
    return steps


def rebase(messages) -> list[Message]:
    """Messages with times from the first one (µs on a lifeline read better than a clock)."""
    msgs = list(messages)
    t0 = next((m.t for m in msgs if m.t is not None), 0.0)
    return [Message(m.src, m.dst, m.label, None if m.t is None else m.t - t0, m.ok)
            for m in msgs]


def engine_core_split(*, tp: int = 2, prompt_len: int = 160, new_tokens: int = 8) -> SplitResult:
    """One request through a vLLM-like scheduler whose pages live on ``tp`` simulated workers.
    The null block's page is mapped while the pool is built; the messages start after it."""
    from workbench.sim.workers import SimCluster
    from workbench.viz.sequence import RecordingTransport

    geo = WALK_GEOMETRY
    cluster = SimCluster(geo, tp, 1)
    rt = RecordingTransport(cluster, name="EngineCore")
    rec = Recording()
    fan = FanOutSpace(geo, rt, targets_for(tp, 1), timeout=0.01)
    kv = KVCacheManager(geo, space=fan, config=NO_RESERVE, events=rec.log)
    rec.add_pool(kv)
    rt.messages.clear()
    rec.mark("pool built (null block on page 0)")
    pool = BlockPool(kv, enable_caching=False)
    sched = VLLMScheduler(VLLMKVManager(pool), max_num_batched_tokens=64)
    _run(sched, Request(0, prompt_tokens(prompt_len), new_tokens))
    rec.mark("request finished")
    names = ["EngineCore"] + [str(t) for t in targets_for(tp, 1)]
    held = {str(t): sorted(s["mapped"]) for t, s in cluster.states().items()}
    decisions = sum(1 for e in kv.events if e.page > 0)
    return SplitResult(rebase(rt.messages), names, held, decisions, rec)


@dataclass(slots=True)
class RanksResult:
    rec: Recording  # one pool per rank, stacked in the page map; one step per engine step
    pages: dict[str, list[int]]  # pages each rank's pool mapped while the request ran
    messages: int  # between ranks: always 0 here (there is no channel)
    busiest: int  # the recording step at which the ranks held the most pages


def sglang_ranks(*, tp: int = 2, prompt_len: int = 160, new_tokens: int = 8,
                 backend: str = "sim") -> RanksResult:
    """The same request on every TP rank, each with its own radix cache and pool, stepped in
    lock-step as the ranks of one SGLang server run."""
    from workbench.backends import make_device

    rec = Recording()
    pools = local_pools(WALK_GEOMETRY, [make_device(backend) for _ in range(tp)],
                        name="sglang", config=NO_RESERVE, events=rec.log)
    for kv in pools:
        rec.add_pool(kv)
    rec.mark("every rank built its own pool")
    scheds = [SGLangScheduler(RadixCache(kv, enable_caching=False), run_blocks=0,
                              max_prefill_tokens=64, chunked_prefill_size=64) for kv in pools]
    for sched in scheds:  # every rank receives the same request
        sched.add_request(Request(0, prompt_tokens(prompt_len), new_tokens))
    busiest, most, step = 0, 0, 0
    while any(s.has_work() for s in scheds):
        step += 1
        for sched in scheds:  # each rank's scheduler decides for its own pool only
            sched.update(sched.schedule(), 0.01 * step)
        k = rec.mark(f"step {step}")
        held = sum(kv.mapped_bytes for kv in pools)
        if held > most:
            busiest, most = k, held
    pages = {kv.name: sorted({e.page for e in kv.events if e.pool == kv.name and e.page >= 0
                              and e.dst == "in_use"}) for kv in pools}
    return RanksResult(rec, pages, 0, busiest)
