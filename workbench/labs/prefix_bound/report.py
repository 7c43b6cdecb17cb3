"""The prefix-bound lab's Markdown, figures, record and result (:mod:`.prefix_bound`)."""

from __future__ import annotations

from typing import Any

from workbench.engines.models import get_model
from workbench.labs.kit.base import LabResult
from workbench.labs.kit.report import agreement_rows, checks_verdict, grouped_bars
from workbench.labs.kit.phased_sim import GiB
from workbench.labs.prefix_bound.sim import bounds, group_bounds
from workbench.labs.prefix_bound.checks import (
    EXPECT,
    _label,
    checks,
    class_rows,
    memory_row,
    probe_rows,
)
from workbench.labs.kit.record import LabRecord, Manifest


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
