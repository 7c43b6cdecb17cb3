"""Small, seeded runs that chapters record and plot (the logic lives here, not in cells).

:func:`one_request` (chapter 01), :func:`churn` (one pool, an optional limit: 02) and
:func:`colocation` (three pools taking turns, one per-pool request stream each: 04). A "request"
is a list of block ids that grows each step: enough to drive the ledger's alloc/free exactly as an
engine would. Recording step *k* is always labelled "step k:", the value of the step slider.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from workbench.backends import capabilities, make_device
from workbench.config import PoolConfig
from workbench.core.budget_device import BudgetDevice
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError
from workbench.units import GiB, MiB, ceil_div
from workbench.viz.trace import Recording

# A small MHA model: 4 layers x 32 KV heads x 128 dims, bf16 -> 128 KiB blocks, 16 per 2 MiB page
# (256 tokens a page), so a handful of requests fills and empties pages visibly.
SMALL = dict(num_layers=4, kv_heads=32, head_dim=128, block_size=16)


def small_geometry(num_pages: int = 48, **kw) -> KVGeometry:
    spec = {**SMALL, **kw}
    g = KVGeometry(**spec)
    per_page = g.page_size // g.block_bytes
    return KVGeometry(**{**spec, "num_blocks": num_pages * per_page})


@dataclass(slots=True)
class Req:
    rid: int
    tokens: int
    target: int
    blocks: list[int] = field(default_factory=list)


def _grow(kv: KVCacheManager, r: Req, new_tokens: int) -> bool:
    """Give ``r`` blocks for ``new_tokens`` more tokens; False on a miss (nothing changes)."""
    bs = kv.geometry.block_size
    need = ceil_div(r.tokens + new_tokens, bs) - len(r.blocks)
    if need > 0:
        ids = kv.alloc(need)
        if ids is None:
            return False
        r.blocks += ids
    r.tokens += new_tokens
    return True


@dataclass
class ChurnResult:
    rec: Recording
    misses: dict[str, int]  # admissions refused + requests preempted for lack of memory
    finished: dict[str, int]
    limit_results: list = field(default_factory=list)
    # pool -> the requests offered to it, in order: (id, target tokens, first chunk)
    offered: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for n in self.misses:
            self.offered.setdefault(n, [])


def one_request(num_tokens: int = 100, *, block_size: int = 16, others: int = 2, seed: int = 0,
                backend: str = "sim", **device_kw) -> tuple[KVCacheManager, list[int], Recording]:
    """A pool where ``others`` requests came first, then ours: returns the pool, our block table
    and the recording (so its blocks land on pages shared with other requests)."""
    rng = random.Random(seed)
    rec = Recording()
    geo = small_geometry(num_pages=24, block_size=block_size)
    kv = KVCacheManager(geo, make_device(backend, **device_kw), name="pool",
                        config=PoolConfig(min_reserved_pages=1, max_reserved_pages=2),
                        events=rec.log)
    rec.add_pool(kv)
    rec.mark("step 0: start, the null block's page mapped")
    held = []
    for i in range(others):
        ids = kv.alloc(rng.randint(3, 12))
        held.append(ids)
        rec.mark(f"step {len(rec.steps)}: request {i} admitted ({len(ids)} blocks)")
    # Interleave: free one earlier request so ours reuses its scattered blocks.
    if held:
        kv.free(held.pop(0))
        rec.mark(f"step {len(rec.steps)}: request 0 finished")
    ours = kv.alloc(ceil_div(num_tokens, block_size))
    if ours is None:
        raise ConfigError(f"num_tokens={num_tokens}", "the request does not fit in this small "
                          f"pool of {geo.num_blocks} blocks after the others took theirs",
                          "use fewer tokens")
    rec.mark(f"step {len(rec.steps)}: our request admitted ({len(ours)} blocks)")
    return kv, ours, rec


def churn(*, steps: int = 40, load: int = 6, limit_pages: int | None = None,
          limit_at: int | None = None, num_pages: int = 32, seed: int = 0,
          backend: str = "sim", defer_release: bool = False, **device_kw) -> ChurnResult:
    """One pool; step 0 is the empty pool, then each step 1..``steps`` admits requests up to
    ``load``, grows every running request by 64 tokens and finishes those that reached their
    length. At step ``limit_at`` (before its traffic) the limit is set to ``limit_pages`` page
    ids. Recording step *k* is labelled "step k", so a slider's value and its label agree."""
    rng = random.Random(seed)
    rec = Recording()
    geo = small_geometry(num_pages=num_pages)
    kv = KVCacheManager(geo, make_device(backend, **device_kw), name="pool",
                        config=PoolConfig(min_reserved_pages=2, max_reserved_pages=4),
                        events=rec.log, defer_release=defer_release)
    rec.add_pool(kv)
    res = ChurnResult(rec, {"pool": 0}, {"pool": 0})

    def limit_note(step: int) -> str:
        if limit_at is None or step != limit_at or limit_pages is None:
            return ""
        r = kv.set_limit(limit_pages * geo.page_id_bytes)
        res.limit_results.append(r)
        return f" · limit {limit_pages} pages → {r.outcome.value}"

    rec.mark("step 0: start, null block + 2 reserved pages" + limit_note(0))
    running: list[Req] = []
    nid = 0
    for step in range(1, steps + 1):
        note = limit_note(step)
        admitted = done = 0
        while len(running) < load:
            r = Req(nid, 0, rng.randint(300, 1200))
            if not _grow(kv, r, rng.randint(100, 500)):
                res.misses["pool"] += 1
                break
            running.append(r)
            nid += 1
            admitted += 1
        for r in list(running):
            if r.tokens >= r.target:
                kv.free(r.blocks)
                running.remove(r)
                done += 1
            elif not _grow(kv, r, 64):  # no room to grow: preempt (recompute later)
                kv.free(r.blocks)
                running.remove(r)
                res.misses["pool"] += 1
        if defer_release and step % 3 == 2:  # the async barrier passes every third step
            kv.release_retired_through(kv.capture_marker())
        res.finished["pool"] += done
        rec.mark(f"step {step}: +{admitted} −{done} running {len(running)}{note}")
    return res


def request_stream(seed: int, pool: str):
    """The requests offered to one pool, in order: ``Req(k, 0, target)`` with its first chunk
    of tokens. Each pool draws from its own generator, seeded by (seed, pool), so what happens
    to one pool (a limit, a miss) never changes another pool's workload."""
    rng = random.Random(f"{seed}/{pool}")
    k = 0
    while True:
        yield Req(k, 0, rng.randint(600, 2000)), rng.randint(200, 800)
        k += 1


def colocation(*, steps: int = 48, phase: int = 8, busy: int = 6, idle: int = 1,
               limit_pool: str | None = None, limit_gib: float | None = None,
               limit_at: int = 0, device_gib: float = 2.5, seed: int = 0,
               backend: str = "sim", **device_kw) -> ChurnResult:
    """Three pools on one device of ``device_gib``; the busy pool changes every ``phase`` steps
    (``busy`` requests for it, ``idle`` for the others). ``limit_pool`` gets ``limit_gib`` at
    step ``limit_at`` (0: before any traffic). Each pool takes its requests from its own
    :func:`request_stream`, in order: a refused request waits and is offered again next step, so
    ``res.offered[pool]`` is always a prefix of that pool's stream."""
    rec, names, pools = Recording(), ["a", "b", "c"], {}
    # a device of device_gib: sim and host honour the capacity; on a real GPU the three pools
    # share a budget of device_gib instead, so they contend as they would on a GPU that size
    dev = make_device(backend, **{"capacity": int(device_gib * GiB), **device_kw})
    if not capabilities(backend).capacity_settable:
        dev = BudgetDevice(dev, int(device_gib * GiB) // dev.granularity * dev.granularity)
    for n in names:  # each pool could take 2/3 of the device: together they oversubscribe it
        geo = small_geometry(num_pages=int(device_gib * GiB * 2 / 3) // (16 * MiB))
        pools[n] = KVCacheManager(geo, dev, name=n, events=rec.log,
                                  config=PoolConfig(min_reserved_pages=1, max_reserved_pages=3))
        rec.add_pool(pools[n])
    res = ChurnResult(rec, dict.fromkeys(names, 0), dict.fromkeys(names, 0))
    streams = {n: request_stream(seed, n) for n in names}
    waiting: dict[str, tuple[Req, int] | None] = dict.fromkeys(names)

    def limit_note(step: int) -> str:
        if not limit_pool or limit_gib is None or step != limit_at:
            return ""
        kv = pools[limit_pool]
        r = kv.set_limit(int(limit_gib * GiB) // kv.geometry.page_id_bytes
                         * kv.geometry.page_id_bytes)
        res.limit_results.append(r)
        return f" · limit {limit_pool}={limit_gib} GiB → {r.outcome.value}"

    rec.mark("step 0: three pools reserved, nothing mapped but null blocks" + limit_note(0))
    running: dict[str, list[Req]] = {n: [] for n in names}
    for step in range(1, steps + 1):
        hot = names[((step - 1) // phase) % len(names)]
        note = limit_note(step)
        for n in names:
            kv, run = pools[n], running[n]
            want = busy if n == hot else idle
            while len(run) < want:
                if waiting[n] is None:
                    waiting[n] = req, first = next(streams[n])
                    res.offered[n].append((req.rid, req.target, first))
                r, first = waiting[n]
                if not _grow(kv, r, first):
                    res.misses[n] += 1
                    break
                waiting[n] = None
                run.append(r)
            for r in list(run):
                if r.tokens >= r.target:
                    kv.free(r.blocks)
                    run.remove(r)
                    res.finished[n] += 1
                elif not _grow(kv, r, 128):  # no room to grow: preempt
                    kv.free(r.blocks)
                    run.remove(r)
                    res.misses[n] += 1
        rec.mark(f"step {step}: busy={hot} " + " ".join(f"{n}:{len(running[n])}" for n in names)
                 + note)
    return res


@dataclass
class TxResult:
    messages: list
    participants: list[str]
    outcome: str  # what the pool did with the page, in words
    events: list


def tp_transaction(*, tp: int = 2, fault: str | None = None, fault_worker: int = 1,
                   seed: int = 0) -> TxResult:
    """A page mapped on ``tp`` simulated workers, then freed: the coordinator maps it
    everywhere, and the free runs prepare → commit on every worker. ``fault`` (a
    :class:`~workbench.sim.workers.Fault` kind, e.g. "drop_reply") hits worker
    ``fault_worker``'s prepare, to show the abort or failure path."""
    from workbench.core.coordinator import FanOutSpace, WorkerId, targets_for
    from workbench.sim.workers import Fault, SimCluster
    from workbench.viz.sequence import RecordingTransport

    geo = KVGeometry(num_layers=2, kv_heads=2, head_dim=64, block_size=16, num_blocks=1024)
    faults = [Fault(fault, op="prepare", worker=WorkerId(0, fault_worker))] if fault else []
    cluster = SimCluster(geo, tp, 1, faults=faults)
    rt = RecordingTransport(cluster)
    fan = FanOutSpace(geo, rt, targets_for(tp, 1), timeout=0.01)
    kv = KVCacheManager(geo, space=fan, events=Recording().log,
                        config=PoolConfig(prealloc=False, min_reserved_pages=0,
                                          max_reserved_pages=0))
    rt.messages.clear()  # keep the page we follow, not the null block's setup
    per_page = geo.page_size // geo.block_bytes
    ids = kv.alloc(per_page + 1)  # spills onto page 1
    assert ids is not None
    page1 = [b for b in ids if geo.block_page(b) == 1]
    try:
        kv.free(page1)
        outcome = f"page 1 state after the free: {kv.pages.state[1].value}"
    except Exception as err:  # noqa: BLE001 - the chapter shows the typed error
        outcome = f"{type(err).__name__}: {err}"
    names = ["coordinator"] + [str(t) for t in targets_for(tp, 1)]
    return TxResult(rt.messages, names, outcome, list(kv.events))


@dataclass
class PrefixResult:
    rec: Recording
    ownership: list[list[tuple[int, int, int]]]  # per step, per page: (held, cached, free)
    hits: int
    queries: int
    misses: dict[str, int]
    finished: dict[str, int]
    mapped_live_bytes: list[tuple[int, int]] = field(default_factory=list)  # per step

    @property
    def pool(self):
        return self.rec.managers["pool"]


def _ownership(bp, kv: KVCacheManager) -> list[tuple[int, int, int]]:
    """Per page: blocks held by requests (ref > 0, the null block too), cached blocks nobody
    holds (ref 0, in the LRU), free blocks."""
    g = kv.geometry
    out = []
    for p in range(g.num_pages):
        blocks = g.page_blocks(p)
        cached = sum(1 for b in blocks if b in bp.evictable)
        occ = kv.page_occupancy(p)
        out.append((occ - cached, cached, len(blocks) - occ))
    return out


def _cached_prefix(bp, hashes: list) -> list[int]:
    """The blocks of the longest cached prefix of ``hashes`` (a vLLM prefix-cache hit)."""
    hit: list[int] = []
    for h in hashes:
        got = bp.get_cached_block(h)
        if got is None:
            break
        hit.append(got[0])
    return hit


def prefix_sharing(*, steps: int = 30, arrivals: int = 2, max_cached_tokens: int = -1,
                   page_aware: bool = True, shared: float = 0.6, num_pages: int = 16,
                   seed: int = 0, backend: str = "sim", reset_at: int | None = None,
                   **device_kw) -> PrefixResult:
    """vLLM-style prefix caching on the elastic ledger (``workbench.engines.sched.block_pool``).

    Each step ``arrivals`` requests come in; a fraction ``shared`` of them start with one of two
    system prompts (20 and 10 blocks), the rest are unique. A request lives 1–3 steps; when it
    ends its full blocks stay cached (ref 0) unless the cap (``max_cached_tokens``, -1 = none)
    evicts them — page-aware or LRU. ``reset_at`` empties the prefix cache at that step."""
    from workbench.engines.sched.block_pool import BlockPool, hash_chain

    rng = random.Random(seed)
    rec = Recording()
    geo = small_geometry(num_pages=num_pages)
    kv = KVCacheManager(geo, make_device(backend, **device_kw), name="pool", events=rec.log,
                        config=PoolConfig(min_reserved_pages=0, max_reserved_pages=1))
    rec.add_pool(kv)
    bp = BlockPool(kv, max_cached_tokens=max_cached_tokens, page_aware=page_aware)
    bs = geo.block_size
    prompts = [[rng.randrange(1, 50_000) for _ in range(n * bs)] for n in (20, 10)]
    res = PrefixResult(rec, [], 0, 0, {"pool": 0}, {"pool": 0})

    def mark(label: str) -> None:
        rec.mark(label)
        res.ownership.append(_ownership(bp, kv))
        held = sum(h for h, _, _ in res.ownership[-1]) * geo.block_bytes * geo.num_layers \
            * geo.num_buffers
        res.mapped_live_bytes.append((kv.mapped_bytes, held))

    mark("step 0: start")
    running: list[tuple[int, list[int]]] = []  # (finish step, blocks)
    for step in range(1, steps + 1):
        note = ""
        if reset_at is not None and step == reset_at:
            note = f" · reset prefix cache ({bp.reset_prefix_cache()} blocks evicted)"
        for end, blocks in [r for r in running if r[0] == step]:
            bp.free_blocks(reversed(blocks))  # tail first: the prefix stays longest
            running.remove((end, blocks))
            res.finished["pool"] += 1
        for _ in range(arrivals):
            head = prompts[rng.randrange(2)] if rng.random() < shared else []
            tokens = head + [rng.randrange(1, 50_000) for _ in range(rng.randint(40, 300))]
            hashes = hash_chain(tokens, bs)
            hit = _cached_prefix(bp, hashes)
            res.queries += 1
            res.hits += len(hit)
            bp.touch(hit)
            new = bp.get_new_blocks(ceil_div(len(tokens), bs) - len(hit))
            if new is None:
                bp.free_blocks(reversed(hit))
                res.misses["pool"] += 1
                continue
            blocks = hit + new
            bp.cache_full_blocks(blocks, hashes, len(hit), len(hashes))
            running.append((step + rng.randint(1, 3), blocks))
        mark(f"step {step}: {len(running)} running, {len(bp.evictable)} cached blocks{note}")
    return res


def radix_demo(prompts: list[str] | None = None, *, page: int = 4,
               backend: str = "sim") -> list[str]:
    """SGLang-style: insert a few requests into a RadixCache on the ledger and report what each
    new request would reuse (``workbench.engines.sched.radix_cache``). Tokens are words here."""
    from workbench.engines.sched.radix_cache import RadixCache

    prompts = prompts or [
        "you are a helpful assistant . answer briefly . what is a page ?",
        "you are a helpful assistant . answer briefly . what is a block ?",
        "you are a helpful assistant . think step by step . why ?",
        "translate to french : good morning",
    ]
    vocab: dict[str, int] = {}
    geo = small_geometry(num_pages=4, block_size=page)
    kv = KVCacheManager(geo, make_device(backend), name="sglang",
                        config=PoolConfig(min_reserved_pages=0, max_reserved_pages=1))
    rc = RadixCache(kv)
    lines = []
    for text in prompts:
        toks = [vocab.setdefault(w, len(vocab) + 1) for w in text.split()]
        hit, node = rc.match_prefix(toks)
        rc.inc_lock_ref(node)  # the running request pins the matched path
        aligned = len(toks) - len(toks) % page
        new = rc.alloc((aligned - len(hit) * page) // page) or []
        rc.insert(toks[:aligned], hit + new)
        rc.dec_lock_ref(node)
        pages = sorted({geo.block_page(b) for b in hit + new})
        lines.append(f"{len(hit) * page:>3} of {len(toks):>2} tokens reused · KV pages "
                     f"(SGLang pages = ledger blocks) {hit + new} on VMM page(s) {pages} · "
                     f"{text!r}")
    lines.append(f"tree holds {rc.cached_tokens} tokens; evictable {rc.evictable_size}, "
                 f"locked {rc.protected_size}")
    return lines
