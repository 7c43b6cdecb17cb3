"""The prefix-bound lab's tables, checks, Markdown, record and figures (:mod:`.prefix_bound`)."""

from __future__ import annotations

from typing import Any

from workbench.engines.metrics import Dist
from workbench.labs.kit.report import ms_or_none as _ms
from workbench.labs.kit.phased_sim import GiB, window_slice
from workbench.labs.prefix_bound.sim import CLASSES, bounds, group_bounds


def _label(b: int) -> str:
    return {-1: "-1 (unlimited)", 0: "0 (evict at once)"}.get(b, f"{b} tokens")


def class_rows(run: dict, bound: int) -> list[dict[str, Any]]:
    inst = run["instances"][0]
    reqs = inst["requests"]
    rows = []
    for cls in CLASSES:
        rs = [r for r in reqs if r["group"].split(":")[0] == cls]
        prompt = sum(r["prompt_len"] for r in rs)
        hit = sum(r["hit_tokens"] for r in rs)
        ttft = Dist.of([r["ttft"] for r in rs if r["ttft"] is not None])
        rows.append({"bound": bound, "class": cls, "requests": len(rs),
                     "hit_tokens": hit, "prompt_tokens": prompt,
                     "token_hit_rate": round(hit / prompt, 3) if prompt else None,
                     "requests_with_hit": sum(1 for r in rs if r["hit_tokens"]),
                     "computed_prefill_tokens": prompt - hit,
                     "ttft_p50_ms": _ms(ttft.p50), "ttft_p95_ms": _ms(ttft.p95),
                     "ttft_p99_ms": _ms(ttft.p99)})
    return rows


def memory_row(run: dict, bound: int) -> dict[str, Any]:
    name = run["instances"][0]["name"]
    tl, bpp = run["timeline"][name], run["blocks_per_page"]
    w = {x["name"]: x for x in run["windows"][name]}["idle"]
    idle = window_slice(tl, w["start"], w["end"])
    end = {k: v[-1] for k, v in idle.items()}
    ev = run["instances"][0]["evicted_tokens"]
    return {"bound": bound, "peak_mapped_pages": max(tl["mapped_bytes"]) // run["page_id_bytes"],
            "idle_in_use_pages": end["in_use_pages"], "idle_reserved_pages": end["reserved_pages"],
            "idle_cached_tokens": end["cached_blocks"] * run["block_size"],
            "idle_mapped_gib": round(end["mapped_bytes"] / GiB, 3),
            "idle_page_occupancy": round((end["used_blocks"] + 1) / (end["in_use_pages"] * bpp),
                                         3),
            "evicted_cap_tokens": ev["cap"], "evicted_lru_tokens": ev["lru"],
            "running_at_idle_end": end["running"]}


def probe_rows(g: dict, bound: int) -> list[dict[str, Any]]:
    out = []
    for r in g["run"]["instances"][0]["requests"]:
        m = g["meta"][r["rid"]]
        if m["group"] == "warm":
            continue
        out.append({"bound": bound, "group": m["group"], "rid": r["rid"],
                    "expected_hit": m["expected_hit"], "hit_tokens": r["hit_tokens"],
                    "computed_tokens": r["prompt_len"] - r["hit_tokens"],
                    "ttft_ms": _ms(r["ttft"])})
    return out


def _live_only(run: dict) -> bool:
    """Every hit came from a request of the same key that was still running at admission."""
    reqs = run["instances"][0]["requests"]
    for r in reqs:
        if r["hit_tokens"] and r["group"].split(":")[0] != "unique":
            if not any(o["group"] == r["group"] and o["rid"] != r["rid"]
                       and o["admitted"] <= r["admitted"] < o["finish"] for o in reqs):
                return False
    return True


def checks(p: Any, data: dict, seed: int) -> dict[str, bool]:
    b_n = p.bounded
    cls = {b: {r["class"]: r for r in class_rows(data["classes"][b][seed], b)} for b in bounds(p)}
    mem = {b: memory_row(data["classes"][b][seed], b) for b in bounds(p)}
    probes = {b: probe_rows(data["groups"][b][seed], b) for b in group_bounds(p)}
    reuse = {b: sum(cls[b][c]["hit_tokens"] for c in ("shared", "repeat")) for b in bounds(p)}
    a = [x["ttft_ms"] for x in probes[-1] if x["group"] == "A"]
    d = [x["ttft_ms"] for x in probes[-1] if x["group"] == "D"]
    return {
        "reuse_unlimited>=N>=0": reuse[-1] >= reuse[b_n] >= reuse[0],
        "idle_pages_unlimited>=N>=0": mem[-1]["idle_in_use_pages"] >= mem[b_n][
            "idle_in_use_pages"] >= mem[0]["idle_in_use_pages"],
        "zero_keeps_nothing_idle": mem[0]["idle_in_use_pages"] == 1
        and mem[0]["idle_cached_tokens"] == 0,
        "N_within_bound_idle": mem[b_n]["idle_cached_tokens"] <= b_n,
        "unlimited_never_cap_evicts": mem[-1]["evicted_cap_tokens"] == 0,
        "unique_never_hits": all(cls[b]["unique"]["hit_tokens"] == 0 for b in bounds(p)),
        "zero_hits_only_live_sharing": _live_only(data["classes"][0][seed]),
        "groups_unlimited_as_expected": all(x["hit_tokens"] == x["expected_hit"]
                                            for x in probes[-1]),
        "groups_zero_no_hits": all(x["hit_tokens"] == 0 for x in probes[0]),
        "groups_never_above_expected": all(x["hit_tokens"] <= x["expected_hit"]
                                           for b in group_bounds(p) for x in probes[b]),
        "small_bound_caps_depth": all(x["hit_tokens"] <= p.doc_bound
                                      for x in probes[p.doc_bound]),
        "deeper_hit_faster": max(a) < min(d),
    }


EXPECT = [
    ("-1 has the highest reuse potential, 0 the least, N between",
     ("reuse_unlimited>=N>=0", "unique_never_hits")),
    ("-1 the weakest elasticity: idle keeps the most pages; 0 keeps none",
     ("idle_pages_unlimited>=N>=0", "zero_keeps_nothing_idle", "unlimited_never_cap_evicts")),
    ("0 evicts once ownership becomes evictable: hits only while a sharer still runs",
     ("zero_hits_only_live_sharing",)),
    ("N bounds what stays cached", ("N_within_bound_idle",)),
    ("E4: A full hit, B breaks at the early change, C reuses up to the late change's block, D "
     "reuses nothing", ("groups_unlimited_as_expected", "groups_never_above_expected")),
    ("E4 with bound 0: nothing is left to hit between sequential probes",
     ("groups_zero_no_hits",)),
    ("E4 with a bound below the document: reuse depth is capped by what stays cached",
     ("small_bound_caps_depth",)),
    ("deeper hit, shorter TTFT", ("deeper_hit_faster",)),
]
