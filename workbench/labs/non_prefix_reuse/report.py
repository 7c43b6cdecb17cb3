"""The non-prefix-reuse lab's tables, checks, Markdown, record and figures
(:mod:`.sim`)."""

from __future__ import annotations

import math
from typing import Any

from workbench.engines.models import get_model
from workbench.labs.kit.base import LabResult
from workbench.labs.kit.record import LabRecord, Manifest
from workbench.labs.kit.report import agreement_rows, checks_verdict, grouped_bars
from workbench.labs.non_prefix_reuse.sim import CASES

EXPECT = (
    ("with an unchanged prefix, blending adds nothing: it equals the exact prefix cache",
     "same_order"),
    ("reordered, re-prefaced or swapped documents: the exact prefix cache recomputes almost "
     "all; blending reuses the documents and answers sooner", "blend_wins"),
    ("recomputed tokens = tokens not found + the chosen fraction of the reused ones; TTFT "
     "rises with the fraction, and at 100% blending costs more than the prefix cache",
     "ratio_rule"),
    ("a document off the chunk grid (a tokenisation boundary) is not found: blending falls "
     "back to the exact prefix", "off_grid"),
)
PROXY = ("host only: the proxy (KL to full prefill) never grows as the recomputed fraction "
         "grows, and vanishes at 100%", "proxy_shrinks")


def _ms(x: float) -> float:
    return round(x * 1e3, 1)


def case_rows(p: Any, data: dict, seed: int) -> list[dict[str, Any]]:
    rows = []
    for c in CASES:
        run = data["runs"][c][seed]
        for scheme in ("full", "prefix"):
            x = run[scheme]
            rows.append({"case": c, "scheme": scheme, "ttft_ms": _ms(x["ttft"]),
                         "recomputed": x["recomputed"], "reused": x["reused"],
                         "retrieved_mib": round(x["bytes"] / 2**20, 1)})
        x = run["blend"][p.recompute_ratio]
        rows.append({"case": c, "scheme": f"blend {p.recompute_ratio:g}",
                     "ttft_ms": _ms(x["ttft"]), "recomputed": x["recomputed"],
                     "reused": x["reused"], "retrieved_mib": round(x["bytes"] / 2**20, 1)})
    return rows


def ratio_rows(data: dict, seed: int) -> list[dict[str, Any]]:
    return [{"case": c, "ratio": r, "ttft_ms": _ms(x["ttft"]), "recomputed": x["recomputed"],
             "blended": x["blended"]}
            for c in CASES for r, x in data["runs"][c][seed]["blend"].items()]


def checks(p: Any, data: dict, seed: int) -> dict[str, bool]:
    run = {c: data["runs"][c][seed] for c in CASES}
    ratios = sorted(data["ratios"])
    same = run["same-order"]
    same_order = all(math.isclose(b["ttft"], same["prefix"]["ttft"]) and
                     b["recomputed"] == same["prefix"]["recomputed"]
                     for b in same["blend"].values())
    low = [r for r in ratios if r < 0.5]
    blend_wins = all(run[c]["blend"][r]["ttft"] < min(run[c]["prefix"]["ttft"],
                                                      run[c]["full"]["ttft"])
                     and run[c]["prefix"]["reused"] <= p.preamble_len
                     and run[c]["blend"][r]["blended"] > 0
                     for c in ("reordered", "new-preamble", "swapped-doc") for r in low)
    rule = True
    for c in ("reordered", "new-preamble", "swapped-doc"):
        b, n, hit = run[c]["blend"], run[c]["prompt_len"], run[c]["prefix"]["reused"]
        for r in ratios:
            fresh = n - hit - b[r]["blended"]
            rule &= b[r]["recomputed"] == fresh + math.ceil(r * b[r]["blended"])
        ts = [b[x]["ttft"] for x in ratios]
        rule &= all(x < y for x, y in zip(ts[:-1], ts[1:], strict=True))
        rule &= 1.0 not in b or b[1.0]["ttft"] > run[c]["prefix"]["ttft"]
    og = run["off-grid"]
    off_grid = all(x["blended"] == 0 and math.isclose(x["ttft"], og["prefix"]["ttft"])
                   for x in og["blend"].values())
    out = {"same_order": same_order, "blend_wins": blend_wins, "ratio_rule": rule,
           "off_grid": off_grid}
    q = data.get("quality")
    if q:  # host: the proxy shrinks as more is recomputed, and vanishes at 100%
        rows = [r for r in q["rows"] if r["seed"] == seed]
        ok = True
        for c in {r["case"] for r in rows}:
            kls = [r["kl"] for r in sorted((r for r in rows if r["case"] == c),
                                           key=lambda r: r["ratio"])]
            ok &= all(a >= b - 1e-7 for a, b in zip(kls[:-1], kls[1:], strict=True))
            ok &= kls[-1] < 1e-6
        out["proxy_shrinks"] = ok
    return out


def markdown(p: Any, data: dict, found: list[dict], tables: dict) -> str:
    lines = ["# Non-prefix reuse: full prefill, exact prefix, blended reuse (costs simulated)",
             "", f"A {p.model} on a simulated {p.gpu}. Prompt: a {p.preamble_len}-token "
             f"preamble, {p.docs_per_prompt} documents of {p.doc_len} tokens from a pool of "
             f"{p.pool_docs} (each saved alone before, in pinned DRAM), a {p.question_len}-token "
             f"question; chunks of {p.chunk_tokens}. Blending is CacheBlend's idea, modelled "
             f"(not measured): reuse found chunks, recompute {p.recompute_ratio:.0%} of their "
             f"tokens. Seeds {data['seeds']}, the case order reversed on odd seeds. Seed 003 E9.",
             "", *agreement_rows(EXPECT + ((PROXY,) if data.get("quality") else ()), found)]
    lines += ["", "## Cases (first seed)", "",
              "| case | scheme | TTFT ms | recomputed tokens | reused tokens | retrieved MiB |",
              "|---|---|---|---|---|---|"]
    for r in tables["cases"]:
        lines.append(f"| {r['case']} | {r['scheme']} | {r['ttft_ms']} | {r['recomputed']} | "
                     f"{r['reused']} | {r['retrieved_mib']} |")
    lines += ["", "## Quality", ""]
    q = data.get("quality")
    if q is None:
        lines.append("**Not measured.** The simulator has no model outputs, so nothing here "
                     "says blended reuse keeps quality. The seed is explicit: without a task-"
                     "level quality evaluation (answer accuracy, citation correctness, a RAG "
                     "score) do not call it lossless acceleration.")
    else:
        lines += [q["markdown"]]
    kvb = get_model(p.model).kv_bytes_per_token
    lines += ["", "## Reading it", "",
              "* An exact prefix cache keys each chunk by everything before it, so a reordered "
              "document, a new preamble or a swapped first document ends the reuse at the first "
              "change. Blending looks documents up by their content alone and loads them "
              f"wherever they sit ({kvb // 1024} KiB per token over the host link), then "
              "recomputes a fraction of their tokens so they can attend the documents before "
              "them, which their saved KV never saw.",
              "* The fraction is the price: every recomputed token attends the whole context. At "
              "100% blending is a full prefill plus the load.",
              "* Position-free keys need documents on the chunk grid; one stray token before "
              "them (a template or tokenisation boundary) shifts every chunk and nothing is "
              "found. Real systems segment at document boundaries for this reason.",
              "* Not modelled: re-rotating the loaded keys to their new positions, the choice "
              "of *which* tokens to recompute (CacheBlend picks those whose KV deviates most), "
              "overlap of loading with computing."]
    return "\n".join(lines) + "\n"


def figures(tables: dict) -> dict[str, Any]:
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    bars = grouped_bars(go, tables["cases"], "scheme", "case", "ttft_ms",
                        title="TTFT per case and scheme", yaxis_title="ms")
    ratio = go.Figure()
    for c in CASES:
        rs = [r for r in tables["ratios"] if r["case"] == c]
        ratio.add_scatter(x=[r["ratio"] for r in rs], y=[r["ttft_ms"] for r in rs], name=c)
    ratio.update_layout(title="blended TTFT against the recomputed fraction",
                        xaxis_title="recompute fraction of reused tokens", yaxis_title="ms")
    return {"ttft": bars, "recompute_ratio": ratio}


def build(p: Any, data: dict, backend: str) -> LabResult:
    seed = data["seeds"][0]
    tables = {"cases": case_rows(p, data, seed), "ratios": ratio_rows(data, seed)}
    if data.get("quality"):
        tables["quality"] = data["quality"]["rows"]
    found = [checks(p, data, s) for s in data["seeds"]]
    tables["checks"] = [dict(f, seed=s) for f, s in zip(found, data["seeds"], strict=True)]
    return LabResult(record(p, data, found, tables, backend), markdown(p, data, found, tables),
                     tables=tables, figures=figures(tables))


def record(p: Any, data: dict, found: list[dict], tables: dict, backend: str) -> LabRecord:
    key = {f"{r['case']}/{r['scheme']}": r for r in tables["cases"]}
    q = data.get("quality")
    return LabRecord(
        experiment_id=f"non-prefix-reuse-{p.model}",
        hypothesis="blended reuse of documents found anywhere in the prompt cuts TTFT where an "
                   "exact prefix cache cannot; the recomputed fraction sets the price",
        environment={"backend": backend, "seeds": data["seeds"],
                     "command": f"workbench labs run non-prefix-reuse --backend {backend}",
                     "modelled": "CacheBlend-style blending; not measured"},
        model_io={"model": p.model, "preamble": p.preamble_len, "doc": p.doc_len,
                  "docs_per_prompt": p.docs_per_prompt, "question": p.question_len},
        cache_state="every pool document saved alone in DRAM; the prefix cache warmed by the "
                    "documents in their original order",
        load={"concurrency": 1}, samples={"seeds": data["seeds"], "order": data["order"]},
        outcomes={"cases": len(CASES)},
        ttft={k: v["ttft_ms"] for k, v in key.items()},
        tpot_itl={"note": "decode unchanged; not reported"}, e2e={}, throughput={},
        slo_goodput={},
        hits={k: {"reused": v["reused"], "recomputed": v["recomputed"]} for k, v in key.items()},
        transfer_bytes={k: {"retrieved_mib": v["retrieved_mib"]} for k, v in key.items()},
        phase_times=None, kv={"checks": found},
        correctness=("quality proxy on the mini model (random weights): " + q["summary"])
        if q else "quality not measured (sim); the seed forbids calling it lossless without a "
                  "task-level evaluation",
        raw_data={"ratios": "results.ratios"},
        verdict=checks_verdict(found),
        mechanism="position-free document keys find reused KV anywhere; recomputing a fraction "
                  "restores some cross-document attention at a cost linear in the fraction",
        open_questions=["task-level quality (needs trained weights and a RAG task)",
                        "which tokens to recompute, and RoPE re-rotation cost"],
        applicability="one request at a time, documents on the chunk grid, modelled costs",
        manifest=Manifest.collect(
            hardware={"gpu": f"simulated {p.gpu}"},
            engine_config={"engine": "cost model (sim)", "model": p.model},
            kvcached_config={"chunk_tokens": p.chunk_tokens, "ratio": p.recompute_ratio}),
        results={"cases": tables["cases"], "ratios": tables["ratios"],
                 "quality": tables.get("quality")})
