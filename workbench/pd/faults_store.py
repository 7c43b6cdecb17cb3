"""The store-side fault rows of seed 003 E8 (slow store, identity change, capacity), and
:data:`ROWS`, all seven in the seed's order. See :mod:`workbench.pd.faults`."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from workbench.pd.faults import (
    NS,
    PROMPT,
    FaultCase,
    cancel_in_flight,
    chunk_key,
    chunks,
    fill_store,
    lookup_then_gone,
    p_or_d_fails,
    save_after_finish,
)
from workbench.pd.handover import ObjectStore, output_of, prefill


def store_slow(guards: bool = True, requests: int = 8, timeout_s: float = 0.2,
               recompute_s: float = 0.1, max_fallback: int = 2,
               horizon_s: float = 5.0) -> FaultCase:
    case = FaultCase("store-slow", "the store is slow or unavailable",
                     "timeouts, recompute, queueing and back-pressure",
                     "nothing blocks for ever; fallback concurrency stays bounded")
    env = simpy.Environment()
    store_reply = env.event()  # never triggered: the store is down
    slots = simpy.Resource(env, capacity=max_fallback if guards else requests)
    finished: list[float] = []
    active = [0, 0]  # now, peak

    def request(i: int):
        shown = i < 3
        if shown:
            case.log(f"req{i}", "store", "lookup", env.now)
        wait = env.timeout(timeout_s) if guards else env.event()
        yield store_reply | wait
        if shown:
            case.log("store", f"req{i}", f"no reply in {timeout_s * 1e3:.0f} ms", env.now,
                     "fault", False)
        with slots.request() as slot:
            yield slot
            active[0] += 1
            active[1] = max(active)
            if shown:
                case.log(f"req{i}", f"req{i}", "recompute prompt", env.now, "fallback")
            yield env.timeout(recompute_s)
            active[0] -= 1
        finished.append(env.now)

    for i in range(requests):
        env.process(request(i))
    env.run(until=horizon_s)
    case.log("store", "store", f"{len(finished)}/{requests} finished; peak recompute "
             f"{active[1]}", env.now, "cleanup", len(finished) == requests)
    case.checks = {"nothing blocks for ever": len(finished) == requests,
                   "fallback concurrency bounded": active[1] <= max_fallback}
    case.state = {"finished": len(finished), "peak_fallback": active[1],
                  "recovery_s": round(max(finished), 4) if finished else None,
                  "recomputed_tokens": len(finished) * len(PROMPT)}
    return case


def identity_change(guards: bool = True) -> FaultCase:
    case = FaultCase("identity-change", "the model or adapter identity changes",
                     "the cache namespace", "KV of another identity is never reused")
    store, new_ns = ObjectStore(8, guards), NS + "+lora-a"
    fill_store(store, NS, PROMPT)
    case.log("engine", "store", f"saved under {NS}", 0.0)
    case.log("engine", "engine", "adapter lora-a loaded", 1e-3, "fault", False)
    hits = []
    for c in range(4):
        obj = store.get(chunk_key(store, new_ns, PROMPT, c))
        if obj is None:
            break
        hits.append(obj.data)
    case.log("engine", "store", f"lookup under {new_ns}: hit {len(hits) * 4} tokens", 2e-3,
             "state", not hits)
    want = prefill(new_ns, PROMPT)
    kv = [x for d in hits for x in d] + want[len(hits) * 4:]
    case.log("engine", "engine", f"compute {len(PROMPT) - len(hits) * 4} tokens", 3e-3,
             "fallback")
    case.checks = {"no incompatible KV reused": not hits,
                   "output matches the new identity's prefill": output_of(kv) == output_of(want)}
    case.state = {"hit_tokens": len(hits) * 4, "recomputed_tokens": len(PROMPT) - len(hits) * 4}
    return case


def capacity_exhausted(guards: bool = True) -> FaultCase:
    case = FaultCase("capacity-exhausted", "the cache runs out of capacity",
                     "eviction, admission and fallback",
                     "active or protected objects are never overwritten")
    store = ObjectStore(4, guards)
    fill_store(store, NS, PROMPT)
    keys = [chunk_key(store, NS, PROMPT, c) for c in range(4)]
    reading = [store.get(k) for k in keys[:2]]
    for obj in reading:
        obj.readers += 1
    store.objects[keys[2]].complete = False  # being rewritten: invisible, not evictable
    for k in keys[2:]:
        store.objects.move_to_end(k)  # used after the reader started: LRU order 0, 1, 2, 3
    case.log("reader", "store", "reading chunks 0-1; chunk 2 being written", 0.0)
    other = chunks(prefill(NS, PROMPT[:8] + [99, 98, 97, 96, 95, 94, 93, 92]))
    saved = refused = 0
    mine = []
    case.log("engine", "store", "save 2 new chunks: store full", 1e-3, "fault", False)
    for c in (2, 3):
        obj = store.admit(store.key(NS, 10_000 + c))
        if obj is None:
            refused += 1
            case.log("store", "engine", f"admission refused for new chunk {c}", 1e-3, "state",
                     False)
            continue
        obj.data, obj.complete = list(other[c]), True
        obj.readers += 1  # the saver holds it until the batch's completion notice
        saved += 1
        mine.append(obj)
        gone = store.evicted[-1]
        what = f"old chunk {keys.index(gone)}" if gone in keys else "a new chunk"
        case.log("store", "engine", f"new chunk {c} saved, evicted {what}", 1e-3, "cleanup")
    want = chunks(prefill(NS, PROMPT))
    intact = [obj.data == want[i] for i, obj in enumerate(reading)]
    for obj in reading + mine:
        obj.readers -= 1
    case.log("reader", "store", "read done: " + ("intact" if all(intact) else "overwritten"),
             2e-3, "state", all(intact))
    if refused:
        case.log("engine", "engine", f"{refused} chunk(s) not cached: recompute on next use",
                 2e-3, "fallback")
    case.checks = {"protected objects intact": all(intact),
                   "only idle objects evicted": keys[0] not in store.evicted and
                   keys[1] not in store.evicted and keys[2] not in store.evicted}
    case.state = {"saved_chunks": saved, "refused_chunks": refused,
                  "evicted": len(store.evicted), "output_unchanged_for_reader":
                  output_of([x for o in reading for x in o.data]) ==
                  output_of([x for d in want[:2] for x in d])}
    return case


ROWS: dict[str, Callable[..., FaultCase]] = {
    "lookup-then-gone": lookup_then_gone, "cancel-in-flight": cancel_in_flight,
    "save-after-finish": save_after_finish, "store-slow": store_slow,
    "p-or-d-fails": p_or_d_fails, "identity-change": identity_change,
    "capacity-exhausted": capacity_exhausted}
