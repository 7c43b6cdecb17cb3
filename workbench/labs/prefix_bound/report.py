"""The prefix-bound lab's tables, checks, Markdown, figures, record and result."""

from __future__ import annotations

from typing import Any

from workbench.engines.metrics import Dist
from workbench.engines.models import get_model
from workbench.labs.kit.base import LabResult
from workbench.labs.kit.phased_sim import window_slice
from workbench.labs.kit.record import LabRecord, Manifest
from workbench.labs.kit.report import agreement_rows, checks_verdict, grouped_bars
from workbench.labs.kit.report import ms_or_none as _ms
from workbench.labs.prefix_bound.sim import CLASSES, bounds, group_bounds
from workbench.units import GiB


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


def _mean(xs: list[dict], key: str) -> float:
    return round(sum(x[key] for x in xs) / len(xs), 1)


def markdown(p: Any, data: dict, found: list[dict], tables: dict[str, list]) -> str:
    lines = ["# Prefix-cache bound: -1 / 0 / N (simulated)", "",
             f"One {p.engine}-like {p.model} instance; seed 000 §9 and seed 003 E4. Classes: "
             f"{p.rate:g} req/s for {p.traffic_s:g} s, *shared* ({p.num_prefixes} prefixes of "
             f"{p.prefix_len} tokens + {p.suffix_len}), *unique*, *repeat* (one of "
             f"{p.num_repeat_prompts} prompts), {p.output_len} output tokens, then "
             f"{p.idle_s:g} s idle. N = {p.bounded}. Seeds {data['seeds']}, the bound order "
             "reversed on odd seeds.", "",
             *agreement_rows(EXPECT, found, head="the seeds expect")]
    lines += ["", "## Classes (first seed)", "",
              "| bound | class | req | token hit rate | requests hit | computed prefill tokens "
              "| TTFT p50 / p95 / p99 ms |", "|---|---|---|---|---|---|---|"]
    for r in tables["classes"]:
        lines.append(f"| {_label(r['bound'])} | {r['class']} | {r['requests']} | "
                     f"{r['token_hit_rate']} ({r['hit_tokens']}/{r['prompt_tokens']}) | "
                     f"{r['requests_with_hit']}/{r['requests']} | "
                     f"{r['computed_prefill_tokens']} | {r['ttft_p50_ms']} / "
                     f"{r['ttft_p95_ms']} / {r['ttft_p99_ms']} |")
    lines += ["", "## Memory and evictions (first seed)", "",
              "| bound | peak mapped pages | idle: in-use pages / reserve | idle cached tokens | "
              "idle page occupancy | evicted (bound / LRU) tokens |",
              "|---|---|---|---|---|---|"]
    for m in tables["memory"]:
        lines.append(f"| {_label(m['bound'])} | {m['peak_mapped_pages']} | "
                     f"{m['idle_in_use_pages']} / {m['idle_reserved_pages']} | "
                     f"{m['idle_cached_tokens']} | {m['idle_page_occupancy']} | "
                     f"{m['evicted_cap_tokens']} / {m['evicted_lru_tokens']} |")
    lines += ["", "## Groups A-D: hit depth against TTFT (first seed, mean per group)", "",
              "| bound | group | expected hit | measured hit | computed tokens | TTFT ms |",
              "|---|---|---|---|---|---|"]
    for b in group_bounds(p):
        for g in "ABCD":
            xs = [x for x in tables["probes"] if x["bound"] == b and x["group"] == g]
            lines.append(f"| {_label(b)} | {g} | {xs[0]['expected_hit']} | "
                         f"{_mean(xs, 'hit_tokens')} | {_mean(xs, 'computed_tokens')} | "
                         f"{_mean(xs, 'ttft_ms')} |")
    lines += ["", "## Reading it", "",
              "* **-1** keeps every block a request leaves behind: the most hits and the most "
              "pages held when idle (weakest elasticity). **0** frees a block the moment no "
              "request holds it: hits remain only between requests running at the same time, "
              "and idle memory falls to the null block's page plus the reserve. **N** keeps at "
              "most N tokens, chosen page-aware so whole pages empty.",
              "* Group A still computes its question tokens after a full document hit, and C "
              "computes from the changed token's block on: reuse is block-granular (seed 003 "
              "E4 warns not to call the computed tail a bug). B's early change makes every "
              "later block a different identity; D's preamble shifts the document, which an "
              "exact-prefix cache cannot reuse.",
              "* The *three classes* are our reading of §9.2, whose list is missing in our copy "
              "of the seed.",
              "* TTFT is the roofline step model; the hit counts and page numbers are exact."]
    return "\n".join(lines) + "\n"


def figures(tables: dict[str, list], data: dict, p: Any) -> dict[str, Any]:
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    hits = grouped_bars(go, tables["classes"], "class", lambda r: _label(r["bound"]),
                        "token_hit_rate", ("shared", "unique", "repeat"),
                        title="token hit rate per class and bound",
                        yaxis_title="hit tokens / prompt tokens")
    mem = go.Figure()
    seed = data["seeds"][0]
    for b in bounds(p):
        run = data["classes"][b][seed]
        tl = run["timeline"][run["instances"][0]["name"]]
        mem.add_scatter(x=tl["t"], y=[m / GiB for m in tl["mapped_bytes"]], name=_label(b),
                        mode="lines")
    mem.add_vrect(x0=p.traffic_s, x1=p.traffic_s + p.idle_s, fillcolor="rgba(0,0,0,0.06)",
                  line_width=0, annotation_text="idle")
    mem.update_layout(title="mapped KV per bound", xaxis_title="simulated time (s)",
                      yaxis_title="GiB")
    depth = go.Figure()
    for g in "ABCD":
        xs = [x for x in tables["probes"] if x["group"] == g]
        depth.add_scatter(x=[x["hit_tokens"] for x in xs], y=[x["ttft_ms"] for x in xs],
                          mode="markers", name=f"group {g}",
                          text=[_label(x["bound"]) for x in xs])
    depth.update_layout(title="hit depth against TTFT (groups A-D, every bound)",
                        xaxis_title="hit tokens", yaxis_title="TTFT (ms)")
    return {"hits": hits, "memory": mem, "hit_depth_ttft": depth}


def build(p: Any, data: dict, backend: str) -> LabResult:
    seed = data["seeds"][0]
    tables = {
        "classes": [r for b in bounds(p) for r in class_rows(data["classes"][b][seed], b)],
        "memory": [memory_row(data["classes"][b][seed], b) for b in bounds(p)],
        "probes": [r for b in group_bounds(p) for r in probe_rows(data["groups"][b][seed], b)]}
    found = [checks(p, data, s) for s in data["seeds"]]
    tables["checks"] = [dict(f, seed=s) for f, s in zip(found, data["seeds"], strict=True)]
    return LabResult(record(p, data, found, tables, backend), markdown(p, data, found, tables),
                     tables=tables, figures=figures(tables, data, p))


def record(p: Any, data: dict, found: list[dict], tables: dict, backend: str) -> LabRecord:
    spec = get_model(p.model)
    seed = data["seeds"][0]

    def per(key: str) -> dict:
        return {_label(b): data["classes"][b][seed]["instances"][0]["summary"][key]
                for b in bounds(p)}

    return LabRecord(
        experiment_id=f"prefix-bound-{p.engine}-{p.model}",
        hypothesis="a larger cache bound trades elasticity (idle pages) for reuse (hits, "
                   "computed tokens, TTFT); reuse is exact-prefix and block-granular",
        environment={"backend": backend, "seeds": data["seeds"], "engine": p.engine,
                     "command": "workbench labs run prefix-bound --backend sim"},
        model_io={"model": spec.name, "prefix": p.prefix_len, "suffix": p.suffix_len,
                  "output": p.output_len, "doc_len": p.doc_len},
        cache_state="cold at the start of every run; warm within it",
        load={"rate": p.rate, "traffic_s": p.traffic_s, "idle_s": p.idle_s,
              "arrivals": "Poisson, classes uniform"},
        samples={"seeds": data["seeds"], "order": data["order"]},
        outcomes=per("finished"), ttft=per("ttft"),
        tpot_itl={"tpot": per("tpot"), "itl": per("itl")}, e2e=per("e2e"),
        throughput=per("input_tok_per_s"), slo_goodput={"goodput_req_per_s":
                                                        per("goodput_req_per_s")},
        hits={"per_class": tables["classes"],
              "denominators": "token hit rate: prompt tokens of the class; request hit: "
                              "requests of the class"},
        transfer_bytes=None, phase_times=None,
        kv={"memory": tables["memory"], "checks": found}, correctness=None,
        raw_data={"probes": "results.probes (every A-D probe, every bound)"},
        verdict=checks_verdict(found),
        mechanism="the bound caps cached blocks no request holds; 0 frees at once, -1 never, "
                  "N evicts whole pages first",
        open_questions=["the seed's three request classes are not listed in our copy: ours "
                        "are shared / unique / repeat"],
        applicability="one instance, exact-prefix caching, block size 16",
        manifest=Manifest.collect(
            hardware={"gpu": f"simulated {p.gpu}"},
            engine_config={"engine": f"{p.engine}-like (sim)", "model": spec.name,
                           "prefix_caching": True},
            kvcached_config={"max_cached_tokens": list(group_bounds(p)), "page_size": 2 << 20}),
        results={"classes": tables["classes"], "memory": tables["memory"],
                 "probes": tables["probes"]})
