"""The tp-pp lab's four measurements (seed 000 §11), each on one fresh worker set.

Every function returns plain data: what each rank has mapped, what it holds, the coordinator's
events and the messages it really sent (for the sequence diagrams).
"""

from __future__ import annotations

from typing import Any

from workbench.backends import make_device
from workbench.core.coordinator import TransportError, WorkerId
from workbench.core.ledger import local_pools
from workbench.labs.kit.tp_pp_workers import BPP, GEO, Rig, open_rig, wid
from workbench.percentiles import percentile


def _causes(kv: Any) -> list[str]:
    return [f"page {e.page}: {e.src} -> {e.dst} ({e.cause.split(':')[0]})" for e in kv.events]


def tp_all_or_nothing(backend: str, tp: int, gpus: int | None = None) -> dict[str, Any]:
    """Page 1 maps on every rank; page 2's map fails on the last rank: the others undo it."""
    rig = open_rig(backend, tp, 1, name="tp", gpus=gpus)
    try:
        kv = rig.pool()
        rig.take()
        kv.alloc(BPP)  # fills page 0 (the null block's) and takes one block of page 1
        mapped_ok = rig.mapped()
        held_before = rig.held()
        victim = WorkerId(0, tp - 1)
        rig.fail_device(victim, "create")
        refused = kv.alloc(BPP) is None  # needs page 2: its map fails on the victim
        msgs = rig.take()
        out = {"tp": tp, "victim": wid(victim), "mapped_after_ok_map": mapped_ok,
               "alloc_refused": refused, "mapped_after_failed_map": rig.mapped(),
               "held_before": held_before, "held_after": rig.held(),
               "page2_state": kv.pages.state[2].value, "pool_failed": bool(kv.pages.failed),
               "events": _causes(kv), "messages": msgs}
        out["retry_ok"] = kv.alloc(BPP) is not None  # the pool goes on: page 2 maps now
        out["mapped_after_retry"] = rig.mapped()
        kv.close()
    finally:
        out_left = rig.close()
    return out | out_left


def local_pools_contrast(tp: int) -> dict[str, Any]:
    """SGLang-style: each rank's own pool on its own (simulated) device; nothing broadcast."""
    devs = [make_device("sim", preset="h200", name=f"gpu{r}") for r in range(tp)]
    pools = local_pools(GEO, devs)
    before = [len(d.mappings) for d in devs]
    ids = pools[0].alloc(3 * BPP)
    after = [len(d.mappings) for d in devs]
    pools[0].free(ids)
    for p in pools:
        p.close()
    return {"maps_before": before, "maps_after_rank0_alloc": after}


def _stage_of(mapped: dict[str, list[int]], page: int) -> dict[str, bool]:
    return {w: page in pages for w, pages in mapped.items()}


def pp_namespaces(backend: str, pp: int, gpus: int | None = None) -> dict[str, Any]:
    """pp_rank=-1 maps on every stage, pp_rank=0 on stage 0 only; a stage whose listener is
    missing is refused before any stage changes."""
    rig = open_rig(backend, 1, pp, name="pp", gpus=gpus)
    try:
        files = rig.socket_files() if rig.real else sorted(
            _layout(t) for t in rig.cluster.workers)
        every, first = rig.space(pp_rank=-1), rig.space(pp_rank=0)
        every.map_page(3)
        first.map_page(5)
        mapped = rig.mapped()
        out = {"pp": pp, "socket_files": files, "files_are_real": rig.real,
               "page3_all_stages": _stage_of(mapped, 3), "page5_stage0_only": _stage_of(mapped, 5)}
        every.unmap_page(3)
        first.unmap_page(5)
        out["mapped_after_unmap"] = rig.mapped()
    finally:
        out |= rig.close()
    gone = WorkerId(pp - 1, 0)
    rig = open_rig(backend, 1, pp, name="ppmiss", missing=(gone,), gpus=gpus)
    try:
        try:
            rig.space(pp_rank=-1)
            out["missing_refused"] = ""
        except TransportError as err:
            out["missing_refused"] = str(err).split(":")[0]
        out["missing_stage"] = wid(gone)
        out["messages_sent_when_missing"] = len(rig.take())
        out["mapped_when_missing"] = rig.mapped()
    finally:
        rig.close()
    return out


def _layout(t: WorkerId) -> str:
    """Where the real transport puts rank ``t``'s socket, relative to its pool directory (the
    rule of :func:`workbench.transport.paths.socket_path`, without creating anything)."""
    return f"w{t.tp}.sock" if t.pp == 0 else f"pp{t.pp}/w{t.tp}.sock"


def async_release(backend: str, tp: int, gpus: int | None = None) -> dict[str, Any]:
    """A freed page is RETIRED (still mapped on every rank) until every rank confirms the
    barrier for its epoch; a barrier one rank does not confirm releases nothing."""
    rig = open_rig(backend, tp, 1, name="async", gpus=gpus)
    try:
        kv = rig.pool(defer_release=True)
        ids = kv.alloc(BPP)  # page 1
        kv.free(ids)  # the scheduler frees early: a queued batch may still read page 1
        marker = kv.capture_marker()
        out: dict[str, Any] = {"tp": tp, "state_after_free": kv.pages.state[1].value,
                               "mapped_after_free": rig.mapped(), "marker": marker}
        victim = WorkerId(0, tp - 1)
        rig.take()
        rig.drop_reply(victim, "barrier")
        out["released_incomplete"] = kv.space.release_retired_through(kv, marker)
        out["state_after_incomplete"] = kv.pages.state[1].value
        out["mapped_after_incomplete"] = rig.mapped()
        out["messages_incomplete"] = rig.take()
        out["released_complete"] = kv.space.release_retired_through(kv, marker)
        out["state_after_complete"] = kv.pages.state[1].value
        out["mapped_after_complete"] = rig.mapped()
        out["messages_complete"] = rig.take()
        out["victim"], out["pool_failed"] = wid(victim), bool(kv.pages.failed)
        out["events"] = _causes(kv)
        kv.close()
    finally:
        out |= rig.close()
    return out


def _one_pass(rig: Rig, pages: int) -> dict[str, Any]:
    fan = rig.space()
    now = rig.transport.now
    rows: dict[str, list[float]] = {"map_rt": [], "unmap_rt": [], "map_us": [], "unmap_us": []}
    first: list = []
    for page in range(1, pages + 1):
        for op, call in (("map", fan.map_page), ("unmap", fan.unmap_page)):
            rig.take()
            r0, t0 = fan.round_trips, now()
            call(page)
            rows[f"{op}_us"].append((now() - t0) * 1e6)
            rows[f"{op}_rt"].append(fan.round_trips - r0)
            msgs = rig.take()
            if page == 1:
                first += msgs
    fan.close()
    return rows | {"messages": first}


def round_trips(backend: str, tps: tuple[int, ...], pages: int,
                repeats: int, gpus: int | None = None) -> dict[str, Any]:
    """Map then unmap ``pages`` page ids at each TP, ``repeats`` times, the TP order reversed
    on every other repeat (seed 003 §2); round trips per op and the time each op took."""
    runs: dict[int, dict[str, list]] = {tp: {"map_rt": [], "unmap_rt": [], "map_us": [],
                                             "unmap_us": []} for tp in tps}
    messages: dict[int, list] = {}
    order = []
    for r in range(repeats):
        for tp in (tps if r % 2 == 0 else tuple(reversed(tps))):
            order.append(f"tp{tp}/r{r}")
            rig = open_rig(backend, tp, 1, name=f"rt{tp}", gpus=gpus)
            try:
                one = _one_pass(rig, pages)
            finally:
                rig.close()
            messages.setdefault(tp, one.pop("messages"))
            for k, v in one.items():
                runs[tp][k] += v
    rows = []
    for tp in tps:
        d = runs[tp]
        rows.append({"tp": tp, "ops": len(d["map_rt"]),
                     "map_round_trips": sorted(set(d["map_rt"])),
                     "unmap_round_trips": sorted(set(d["unmap_rt"])),
                     "map_us_p50": _q(d["map_us"], 50), "map_us_p90": _q(d["map_us"], 90),
                     "unmap_us_p50": _q(d["unmap_us"], 50),
                     "unmap_us_p90": _q(d["unmap_us"], 90),
                     "messages_per_unmap": _per_op(messages[tp], "PREPARE", "COMMIT")})
    return {"rows": rows, "order": order, "messages": messages}


def _per_op(msgs: list, *ops: str) -> dict[str, int]:
    """Requests the coordinator sent in the first page's unmap, by op."""
    return {op.lower(): sum(1 for m in msgs if m.label.startswith(op)) for op in ops}


def _q(xs: list[float], q: int) -> float:
    return round(percentile(xs, q), 1)  # linear, as statistics' inclusive quantiles

