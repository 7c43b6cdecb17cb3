"""The tiered-retrieval lab's tables, checks, Markdown, record and figures
(:mod:`.sim`)."""

from __future__ import annotations

import math
from typing import Any

from workbench.engines.metrics import Dist
from workbench.engines.models import get_model
from workbench.labs.kit.base import LabResult
from workbench.labs.kit.record import LabRecord, Manifest
from workbench.labs.kit.report import agreement_rows, checks_verdict, ms_or_none, ttft_percentiles
from workbench.labs.tiered_retrieval.sim import GROUPS, PARTS, costs
from workbench.tiers.presets import PRESETS

EXPECT = (
    ("HBM hit < CPU hit < L2 hit < baseline (TTFT p50), each hit skipping the document's "
     "prefill", "order"),
    ("the CPU group reads only DRAM, the L2 group only the store, every chunk saved by the "
     "other instance", "paths"),
    ("all miss pays the lookup on top of the baseline and computes every token", "miss_cost"),
    ("retrieval wins above the break-even bandwidth and loses below it", "crossover"),
    ("probes arriving together share one link: the load term grows with their number",
     "concurrency"),
)


def _ms(x: float) -> float | None:
    return ms_or_none(x, digits=2)


def group_rows(data: dict, seed: int) -> list[dict[str, Any]]:
    rows = []
    for g in GROUPS:
        ps = data["runs"][g][seed]["probes"]
        d = Dist.of([r["ttft"] for r in ps])
        row = {"group": g, "probes": len(ps), "ttft_p50_ms": _ms(d.p50),
               "ttft_p95_ms": _ms(d.p95), "ttft_p99_ms": _ms(d.p99)}
        for k in PARTS:
            row[f"{k}_ms"] = _ms(sum(r[k] for r in ps) / len(ps))
        src: dict[str, int] = {}
        for r in ps:
            for t, n in r["chunks"].items():
                src[t] = src.get(t, 0) + n
        row.update(local_hit=sum(r["local_hit"] for r in ps),
                   external_hit=sum(r["external_hit"] for r in ps),
                   prompt_tokens=sum(r["prompt_len"] for r in ps),
                   computed=sum(r["computed"] for r in ps), chunks_by_tier=src,
                   cross_instance_chunks=sum(r["cross_instance_chunks"] for r in ps),
                   metadata_requests=sum(r["metadata_requests"] for r in ps),
                   payload_mib=round(sum(r["payload_bytes"] for r in ps) / 2**20, 1),
                   h2d_mib=round(sum(r["h2d_bytes"] for r in ps) / 2**20, 1),
                   save_d2h_ms=_ms(data["runs"][g][seed]["save"]["d2h_s"]),
                   save_put_ms=_ms(data["runs"][g][seed]["save"]["remote_s"]))
        rows.append(row)
    return rows


def checks(p: Any, data: dict, seed: int) -> dict[str, bool]:
    runs = {g: data["runs"][g][seed]["probes"] for g in GROUPS}
    med = {g: Dist.of([r["ttft"] for r in runs[g]]).p50 for g in GROUPS}
    doc = p.doc_len // p.chunk_tokens * p.chunk_tokens
    order = med["hbm"] < med["cpu"] < med["l2"] < med["baseline"] and all(
        r["local_hit"] + r["external_hit"] >= doc for g in ("hbm", "cpu", "l2") for r in runs[g])
    paths = all(set(r["chunks"]) == {"dram"} for r in runs["cpu"]) and all(
        set(r["chunks"]) == {"remote"} and r["cross_instance_chunks"] == r["chunks"]["remote"]
        for r in runs["l2"])
    miss_cost = all(m["external_hit"] == 0 and m["computed"] == m["prompt_len"]
                    and m["ttft"] > b["ttft"] and abs(m["ttft"] - b["ttft"] - m["lookup"]) < 1e-6
                    for m, b in zip(runs["all-miss"], runs["baseline"], strict=True))
    rows = [r for r in data["crossover"] if r["break_even_gbps"] is not None]
    cross = bool(rows) and all((r["winner"] == "retrieve") == (r["gbps"] > r["break_even_gbps"])
                               for r in rows)
    conc = data["concurrency"]
    one = {r["group"]: r["load_sum_ms"] for r in conc if r["concurrency"] == 1}
    concurrency = all(math.isclose(r["load_sum_ms"], r["concurrency"] * one[r["group"]])
                      and r["ttft_p50_ms"] >= r["load_sum_ms"] for r in conc
                      if r["group"] != "baseline") and bool(one)
    return {"order": order, "paths": paths, "miss_cost": miss_cost, "crossover": cross,
            "concurrency": concurrency}


def _preset_line(p: Any) -> str:
    c, prov = costs(p), PRESETS[p.costs][1]
    if prov is None:
        return (f"Costs: the `assumed` preset (host-to-device {c.pcie_bw / 1e9:g} GB/s, "
                f"{c.pcie_op_s * 1e6:g} us per chunk, DRAM lookup {c.dram_lookup_s * 1e6:g} us; "
                "assumptions, not measurements).")
    return (f"Costs: the `{p.costs}` preset: {', '.join(prov.measured)} measured "
            f"(host-to-device {c.pcie_bw / 1e9:.3g} GB/s, {c.pcie_op_s * 1e6:.3g} us per chunk, "
            f"DRAM lookup {c.dram_lookup_s * 1e6:.3g} us) by `{prov.command}` on {prov.device}, "
            f"{prov.date}; {', '.join(prov.assumed)} still assumed.")


def markdown(p: Any, data: dict, found: list[dict], tables: dict) -> str:
    lines = ["# Tiered retrieval: is a cache beyond HBM cheaper than prefilling again? "
             "(simulated)", "",
             f"A vLLM-like {p.model} on a simulated {p.gpu}, with an LMCache-style connector "
             f"(modelled from its documented design, not measured): chunks of {p.chunk_tokens} "
             f"tokens, pinned DRAM at {costs(p).pcie_bw / 1e9:.3g} GB/s host-to-device, a remote "
             f"store at "
             f"{p.remote_gbps:g} GB/s with {p.meta_ms:g} ms per metadata request. Each of "
             f"{p.probes} probes is a {p.doc_len}-token document plus a {p.question_len}-token "
             f"question, a second after a warm request on the same document. Seeds "
             f"{data['seeds']}, the group order reversed on odd seeds. Seed 003 E5.", "",
             _preset_line(p), "", *agreement_rows(EXPECT, found)]
    lines += ["", "## The five groups (first seed; components are means per probe)", "",
              "| group | TTFT p50 / p95 / p99 ms | wait | lookup | retrieve | H2D | prefill | "
              "hit local / external / prompt tokens | chunks by tier | metadata req | "
              "payload MiB | save D2H / put ms |", "|---|---|---|---|---|---|---|---|---|---|---|"
              "---|"]
    for r in tables["groups"]:
        lines.append(f"| {r['group']} | {r['ttft_p50_ms']} / {r['ttft_p95_ms']} / "
                     f"{r['ttft_p99_ms']} | {r['wait_ms']} | {r['lookup_ms']} | "
                     f"{r['retrieve_ms']} | {r['h2d_ms']} | {r['prefill_ms']} | "
                     f"{r['local_hit']} / {r['external_hit']} / {r['prompt_tokens']} | "
                     f"{r['chunks_by_tier'] or '-'} | {r['metadata_requests']} | "
                     f"{r['payload_mib']} | {r['save_d2h_ms']} / {r['save_put_ms']} |")
    lines += ["", "## Crossover: retrieve from the store or recompute", "",
              "| prompt | chunk | retrieved tokens | recompute ms | break-even GB/s | winner at "
              + " / ".join(f"{g:g}" for g in p.sweep_gbps) + " GB/s |", "|---|---|---|---|---|---|"]
    cross = tables["crossover"]
    for n in p.sweep_lens:
        for ch in p.sweep_chunks:
            rs = [r for r in cross if r["prompt_len"] == n and r["chunk"] == ch]
            be = rs[0]["break_even_gbps"]
            lines.append(f"| {n} | {ch} | {rs[0]['hit']} | {round(rs[0]['recompute_ms'], 1)} | "
                         f"{'-' if be is None else round(be, 2)} | "
                         + " / ".join(r["winner"] for r in rs) + " |")
    lines += ["", "## Concurrency: probes arriving at once (first seed)", "",
              "| probes at once | group | TTFT p50 / max ms | loads on the admitting step ms |",
              "|---|---|---|---|"]
    for r in tables["concurrency"]:
        lines.append(f"| {r['concurrency']} | {r['group']} | {round(r['ttft_p50_ms'], 1)} / "
                     f"{round(r['ttft_max_ms'], 1)} | {round(r['load_sum_ms'], 1)} |")
    lines += _reading(p)
    return "\n".join(lines) + "\n"


def figures(tables: dict, p: Any) -> dict[str, Any]:
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    split = go.Figure()
    for k in PARTS:
        split.add_bar(x=[r["group"] for r in tables["groups"]],
                      y=[r[f"{k}_ms"] for r in tables["groups"]], name=k)
    split.update_layout(title="TTFT split per group (mean per probe)", barmode="stack",
                        yaxis_title="ms")
    cross = go.Figure()
    ch = p.chunk_tokens if p.chunk_tokens in p.sweep_chunks else p.sweep_chunks[0]
    for n in p.sweep_lens:
        rs = [r for r in tables["crossover"] if r["prompt_len"] == n and r["chunk"] == ch]
        cross.add_scatter(x=[r["gbps"] for r in rs], y=[r["retrieve_ms"] / r["recompute_ms"]
                                                        for r in rs], name=f"{n} tokens")
    cross.add_hline(y=1.0, line_dash="dash", annotation_text="recompute")
    cross.update_layout(title=f"retrieve / recompute time (chunk {ch})", xaxis_type="log",
                        yaxis_type="log", xaxis_title="store bandwidth (GB/s)",
                        yaxis_title="ratio (< 1: retrieving wins)")
    return {"ttft_split": split, "crossover": cross}


def build(p: Any, data: dict, backend: str) -> LabResult:
    seed = data["seeds"][0]
    tables = {"groups": group_rows(data, seed), "crossover": data["crossover"],
              "concurrency": data["concurrency"]}
    found = [checks(p, data, s) for s in data["seeds"]]
    tables["checks"] = [dict(f, seed=s) for f, s in zip(found, data["seeds"], strict=True)]
    return LabResult(record(p, data, found, tables, backend), markdown(p, data, found, tables),
                     tables=tables, figures=figures(tables, p))


def record(p: Any, data: dict, found: list[dict], tables: dict, backend: str) -> LabRecord:
    g = {r["group"]: r for r in tables["groups"]}
    ttft = ttft_percentiles(g)
    return LabRecord(
        experiment_id=f"tiered-retrieval-{p.model}-{p.gpu}",
        hypothesis="a hit in a tier beyond HBM beats recomputing the prefix while the tier's "
                   "bandwidth is above the break-even; a miss costs the lookup and the save",
        environment={"backend": backend, "seeds": data["seeds"],
                     "command": "workbench labs run tiered-retrieval --backend sim",
                     "modelled": "LMCache-style tiers and a Mooncake-style store; not measured"},
        model_io={"model": p.model, "doc": p.doc_len, "question": p.question_len,
                  "output": p.output_len},
        cache_state="per group: baseline (no external cache, APC off), HBM (APC warm), CPU "
                    "(DRAM warm), L2 (store warm from another instance), all miss (cold)",
        load={"probes": p.probes, "spacing_s": 2.0, "concurrency": 1,
              "concurrency_sweep": list(p.sweep_concurrency)},
        samples={"seeds": data["seeds"], "order": data["order"]},
        outcomes={k: r["probes"] for k, r in g.items()}, ttft=ttft,
        tpot_itl={"note": "decode is unchanged by the tiers; not reported"}, e2e={},
        throughput={}, slo_goodput={},
        hits={k: {"local": r["local_hit"], "external": r["external_hit"],
                  "denominator_prompt_tokens": r["prompt_tokens"],
                  "chunks_by_tier": r["chunks_by_tier"]} for k, r in g.items()},
        transfer_bytes={k: {"payload_mib": r["payload_mib"], "h2d_mib": r["h2d_mib"]}
                        for k, r in g.items()},
        phase_times={k: {x: r[f"{x}_ms"] for x in PARTS} for k, r in g.items()},
        kv={"checks": found}, correctness="exact-prefix reuse only (chained chunk keys); "
                                          "quality is unchanged by construction",
        raw_data={"crossover": "results.crossover"},
        verdict=checks_verdict(found),
        mechanism="retrieval replaces prefill FLOPs by bytes moved; it pays while bytes/s per "
                  "token beat prefill tokens/s",
        open_questions=["calibrate the store's costs (only the host-to-device copy is measured)",
                        "asynchronous loading: here loads admitted together share one step"],
        applicability="one instance (two for L2), one probe at a time, modelled costs",
        manifest=Manifest.collect(
            hardware={"gpu": f"simulated {p.gpu}"},
            engine_config={"engine": "vllm-like (sim)", "model": p.model,
                           "connector": "tier model (LMCache-style, modelled)"},
            kvcached_config={"chunk_tokens": p.chunk_tokens, "pcie_gbps": p.pcie_gbps,
                             "remote_gbps": p.remote_gbps, "meta_ms": p.meta_ms,
                             "cost_preset": p.costs,
                             "effective_pcie_gbps": costs(p).pcie_bw / 1e9}),
        results={"groups": tables["groups"], "crossover": tables["crossover"],
                 "concurrency": tables["concurrency"]})


def _reading(p: Any) -> list[str]:
    """What to read in the tables, and the line between tiers and elastic KV."""
    kvb = get_model(p.model).kv_bytes_per_token
    return ["", "## Reading it", "",
              f"* A hit anywhere skips the document's prefill; what it costs instead is the "
              f"movement: {kvb // 1024} KiB of KV per token. From DRAM that is one host-to-device "
              "copy; from the store a network transfer and then the same copy. HBM moves nothing.",
              "* *All miss* is the baseline plus the lookup that found nothing; the saves after "
              "each prefill (a device-to-host copy on the engine's path, the store put off it) "
              "are the other price of having the tiers.",
              "* The break-even bandwidth is where moving a token's KV costs as much as computing "
              "it. Long prompts amortise the lookup and the remaining prefill, so their "
              "break-even settles near KV bytes per token divided by prefill seconds per token; "
              "short prompts need far more bandwidth, because a short prefill costs little more "
              "than a step's fixed overhead. A chunk larger than the prompt retrieves nothing "
              "(only full chunks are stored), and the partial last chunk is always recomputed.",
              "* The seed separates in-process reuse, cross-process sharing and true remote "
              "reads: here CPU is in-process, L2 is a read of another instance's chunks through "
              "the store.",
              "* Concurrency: the modelled connector loads synchronously, before the step that "
              "admitted the requests, over one link, so loads admitted together add up and "
              "every one of those probes waits for all of them; a prefill without hits instead "
              "staggers its probes through the token budget. An asynchronous load (a request "
              "waiting for its KV while others run) is not modelled.",
              "* Elastic KV is not offload (seed 001 §10): the elastic pool changes which "
              "physical pages back KV *inside* HBM, and no KV byte leaves the GPU; the tiers "
              "here move KV bytes across links, with another data path and other failures.",
              "* No cost here is a measurement of LMCache, Mooncake or any network "
              "(``workbench.tiers.presets``). The `assumed` preset is assumptions throughout; "
              "`--param costs=h200-measured` takes the host-to-device copy and the DRAM lookup "
              "from the mini engine on an H200 (`workbench bench crossover`) and keeps the "
              "store's costs assumed."]
