"""The seven fault rows of seed 003 E8, each driven on :mod:`workbench.pd.handover`'s state:
fault -> state change -> cleanup -> fallback, logged as messages for a sequence diagram, with the
seed's correctness criterion checked on the final state. ``guards=False`` runs the unsafe design
(no deferred free, no namespace, no lease...) so a test can show the criterion then fails.

Times are simulated seconds; the slow-store row runs in SimPy (timeouts and a bounded fallback
queue), the others step a logical clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from workbench.pd.handover import BlockPool, ObjectStore, output_of, prefill

NS = "llama-3.1-8b"
BS = 4  # tokens per block (and per store chunk)
PROMPT = [11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41, 42, 43, 44]
OTHER = [91, 92, 93, 94, 81, 82, 83, 84, 71, 72, 73, 74, 61, 62, 63, 64]


class Step(NamedTuple):
    src: str
    dst: str
    label: str
    t: float | None = None
    ok: bool = True
    phase: str = "normal"  # normal | fault | state | cleanup | fallback


@dataclass(slots=True)
class FaultCase:
    name: str
    fault: str  # the seed's row
    observe: str
    criterion: str
    steps: list[Step] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)  # residual blocks, recompute, recovery

    def log(self, src: str, dst: str, label: str, t: float, phase: str = "normal",
            ok: bool = True) -> None:
        self.steps.append(Step(src, dst, label, t, ok, phase))

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(self.checks.values())


def chunks(kv: list[int]) -> list[list[int]]:
    return [kv[i:i + BS] for i in range(0, len(kv), BS)]


def chunk_key(store: ObjectStore, ns: str, tokens: list[int], c: int) -> tuple:
    return store.key(ns, hash(tuple(tokens[:(c + 1) * BS])))


def fill_store(store: ObjectStore, ns: str, tokens: list[int]) -> None:
    for c, data in enumerate(chunks(prefill(ns, tokens))):
        obj = store.admit(chunk_key(store, ns, tokens, c))
        obj.data, obj.complete = list(data), True


def pool_kv(pool: BlockPool, ids: list[int]) -> list[int]:
    return [x for b in ids for x in pool.read(b)]


def lookup_then_gone(guards: bool = True) -> FaultCase:
    case = FaultCase("lookup-then-gone", "object no longer available after lookup",
                     "retrieve failure and fallback", "tokens not really loaded are never skipped")
    store, pool = ObjectStore(8, guards), BlockPool(4, BS, guards=guards)
    fill_store(store, NS, PROMPT)
    hit = sum(store.lookup(chunk_key(store, NS, PROMPT, c)) for c in range(4)) * BS
    case.log("engine", "store", f"lookup: hit {hit} tokens", 0.0)
    ids = pool.alloc(4, "A")
    store.delete(chunk_key(store, NS, PROMPT, 2))
    case.log("store", "store", "chunk 2 evicted by another client", 1e-3, "fault", False)
    loaded = 0
    for c, b in enumerate(ids):
        obj = store.get(chunk_key(store, NS, PROMPT, c))
        if obj is None:
            case.log("store", "engine", f"retrieve chunk {c}: gone", 2e-3, "state", False)
            break
        pool.write(b, obj.data)
        loaded += BS
    case.log("engine", "engine", f"{loaded} tokens loaded; block {loaded // BS}.. unfilled",
             2e-3, "cleanup")
    computed = loaded if guards else hit  # the unsafe design trusts the lookup
    want = prefill(NS, PROMPT)
    for c in range(computed // BS, 4):
        pool.write(ids[c], want[c * BS:(c + 1) * BS])
    case.log("engine", "engine", f"recompute {len(PROMPT) - computed} tokens", 3e-3, "fallback")
    same = output_of(pool_kv(pool, ids)) == output_of(want)
    pool.release(ids)
    case.checks = {"no unloaded token skipped": computed <= loaded, "output unchanged": same}
    case.state = {"lookup_hit_tokens": hit, "loaded_tokens": loaded,
                  "recomputed_tokens": len(PROMPT) - computed, "residual_blocks": pool.held}
    return case


def cancel_in_flight(guards: bool = True) -> FaultCase:
    case = FaultCase("cancel-in-flight", "client cancels during the transfer",
                     "in-flight copies and the target buffers' lifetime",
                     "memory still being written is not reused early")
    pool = BlockPool(6, BS, guards=guards)
    a = pool.alloc(4, "A")
    data = chunks(prefill(NS, PROMPT))
    for b in a:
        pool.blocks[b].writing = True
    case.log("link", "pool", f"copy 4 chunks into blocks {a}", 0.0)
    pool.write(a[0], data[0])
    pool.blocks[a[0]].writing = False
    case.log("engine", "engine", "client cancels A", 1e-3, "fault", False)
    deferred = pool.release(a, 1e-3)
    case.log("engine", "pool", f"free A: {len(deferred)} blocks deferred (still written)",
             1e-3, "state")
    b_ids = pool.alloc(4, "B")
    reused_early = [] if b_ids is None else [b for b in b_ids if pool.blocks[b].writing]
    case.log("engine", "pool", "B allocates: " + ("waits" if b_ids is None else f"{b_ids}"),
             1e-3, "state", not reused_early)
    want_b = prefill(NS, OTHER)
    if b_ids is not None:
        for i, b in enumerate(b_ids):
            pool.write(b, want_b[i * BS:(i + 1) * BS])
    for c, b in enumerate(a[1:], 1):  # the posted copies land anyway
        pool.write(b, data[c])
        pool.blocks[b].writing = False
    case.log("link", "pool", "in-flight copies complete", 3e-3, "cleanup")
    settled = pool.settle(3e-3)
    case.log("pool", "pool", f"{len(settled)} deferred blocks freed", 3e-3, "cleanup")
    if b_ids is None:
        b_ids = pool.alloc(4, "B")
        for i, b in enumerate(b_ids):
            pool.write(b, want_b[i * BS:(i + 1) * BS])
        case.log("engine", "pool", f"B admitted on {b_ids}", 3e-3, "fallback")
    same = output_of(pool_kv(pool, b_ids)) == output_of(want_b)
    pool.release(b_ids, 4e-3)
    case.checks = {"no block reused while written": not reused_early,
                   "B's output unchanged": same}
    case.state = {"deferred_blocks": len(deferred), "residual_blocks": pool.held}
    return case


def save_after_finish(guards: bool = True) -> FaultCase:
    case = FaultCase("save-after-finish", "request ends before its save completes",
                     "delayed release of the source blocks",
                     "the saved object never mixes in another request's content")
    pool, store = BlockPool(4, BS, guards=guards), ObjectStore(8, guards)
    a = pool.alloc(4, "A")
    for i, d in enumerate(chunks(prefill(NS, PROMPT))):
        pool.write(a[i], d)
    pool.pin(a)
    case.log("engine", "store", "save A: 4 chunks, blocks pinned", 0.0)
    case.log("engine", "engine", "A finishes; save 2 of 4 chunks done", 2e-3, "fault", False)
    for c in range(2):
        obj = store.admit(chunk_key(store, NS, PROMPT, c))
        obj.data, obj.complete = pool.read(a[c]), True
    deferred = pool.release(a, 2e-3)
    case.log("engine", "pool", f"free A: {len(deferred)} blocks deferred (pinned)", 2e-3,
             "state")
    b = pool.alloc(4, "B")
    if b is not None:  # the unsafe design hands A's blocks to B at once
        for i, d in enumerate(chunks(prefill(NS, OTHER))):
            pool.write(b[i], d)
        case.log("engine", "pool", f"B reuses {b}", 2e-3, "state", False)
    for c in range(2, 4):
        obj = store.admit(chunk_key(store, NS, PROMPT, c))
        obj.data, obj.complete = pool.read(a[c]), True
    pool.unpin(a)
    case.log("store", "engine", "save done; unpin", 4e-3, "cleanup")
    freed = pool.settle(4e-3)
    case.log("pool", "pool", f"{len(freed)} blocks freed", 4e-3, "cleanup")
    saved = [x for c in range(4) for x in store.get(chunk_key(store, NS, PROMPT, c)).data]
    case.log("engine", "store", "A' retrieves A's prompt from the store", 5e-3, "fallback")
    case.checks = {"saved object is A's alone": saved == prefill(NS, PROMPT),
                   "a later reuse gives the same output":
                   output_of(saved) == output_of(prefill(NS, PROMPT))}
    case.state = {"deferred_blocks": len(deferred), "residual_blocks": pool.held}
    return case


def p_or_d_fails(guards: bool = True) -> FaultCase:
    case = FaultCase("p-or-d-fails", "the prefill or the decode side fails",
                     "pins, leases and reclaiming resources",
                     "nothing held for ever; a reused source block is never read")
    pool, lease_s = BlockPool(4, BS), 0.5
    a = pool.alloc(4, "A")
    want = prefill(NS, PROMPT)
    for i, d in enumerate(chunks(want)):
        pool.write(a[i], d)
    gens = [pool.blocks[b].generation for b in a]
    pool.pin(a, lease_until=lease_s if guards else None)
    case.log("P", "D", "KV of A ready: blocks pinned" + (f", lease {lease_s:g} s" if guards
                                                         else ", no lease"), 0.0)
    case.log("D", "D", "D crashes before pulling", 0.01, "fault", False)
    pool.release(a, 0.01)
    case.log("P", "pool", "A done on P: free deferred (pinned)", 0.01, "state")
    freed = pool.settle(lease_s + 0.01)
    case.log("P", "pool", f"lease check: {len(freed)} blocks reclaimed", lease_s + 0.01,
             "cleanup", bool(freed))
    held = pool.held
    b = pool.alloc(4, "B")
    if b is not None:
        for i, d in enumerate(chunks(prefill(NS, OTHER))):
            pool.write(b[i], d)
        case.log("P", "pool", f"B reuses {b}", 0.6, "state")
    # D restarts late and pulls A by the block ids and generations it was told
    got = [pool.read(x, g) for x, g in zip(a, gens, strict=True)] if guards else \
        [pool.read(x) for x in a]
    refused = any(x is None for x in got)
    case.log("D", "P", "late pull of A: " + ("refused (generation changed)" if refused
                                            else "data returned"), 0.7, "state", refused)
    kv = want if refused or b is None else [x for blk in got for x in blk]
    if refused:
        case.log("D", "D", "recompute A's prompt", 0.7, "fallback")
    d_held = _p_dies_mid_pull(case, guards)
    case.checks = {"no permanent hold": held == 0 and d_held == 0,
                   "no read of a reused source block": refused or b is None,
                   "A's output unchanged": output_of(kv) == output_of(want)}
    case.state = {"residual_blocks_after_lease": held, "d_landing_blocks_held": d_held,
                  "recomputed_tokens": len(PROMPT) * (int(refused) + (d_held == 0))}
    return case


def _p_dies_mid_pull(case: FaultCase, guards: bool, timeout_s: float = 0.2) -> int:
    """The other half of the row: P dies while D pulls C into its landing blocks. D's pull
    times out (with the guard), the copies are abandoned, the landing blocks are freed and C is
    recomputed; without a timeout D waits for ever, holding them. Returns D's blocks held."""
    d_pool = BlockPool(4, BS)
    land = d_pool.alloc(4, "C")
    for b in land:
        d_pool.blocks[b].writing = True
    case.log("D", "P", f"pull C into landing blocks {land}", 1.0)
    case.log("P", "P", "P dies mid-transfer", 1.01, "fault", False)
    if not guards:
        case.log("D", "D", "no timeout: waiting for P", 1.0 + 10 * timeout_s, "state", False)
        return d_pool.held
    case.log("D", "D", f"pull timed out after {timeout_s * 1e3:.0f} ms", 1.0 + timeout_s,
             "state", False)
    for b in land:
        d_pool.blocks[b].writing = False  # the transport aborted the copies
    d_pool.release(land, 1.0 + timeout_s)
    case.log("D", "pool", "landing blocks freed", 1.0 + timeout_s, "cleanup")
    case.log("D", "D", "recompute C's prompt locally", 1.0 + timeout_s, "fallback")
    return d_pool.held
