"""The store-routes lab's tables, checks, Markdown, record and figures (:mod:`.sim`)."""

from __future__ import annotations

from typing import Any

from workbench.engines.metrics import Dist
from workbench.engines.models import get_model
from workbench.labs.kit.base import LabResult
from workbench.labs.kit.record import LabRecord, Manifest
from workbench.labs.kit.report import agreement_rows, checks_verdict, grouped_bars, ttft_percentiles
from workbench.labs.kit.report import ms_or_none as _ms
from workbench.labs.store_routes.sim import ROUTES, SCENARIOS
from workbench.units import MiB

EXPECT = (
    ("what one instance saved, another compatible instance reads (warm: every read chunk is "
     "cross-instance, both routes)", "cross_instance"),
    ("with nothing to hit, the store's work follows the route's configuration alone (one lookup "
     "and the puts per request): the cache layer adds none", "miss_equal"),
    ("on a hot spot the cache layer serves repeats locally: fewer metadata requests, fewer "
     "payload bytes, lower TTFT", "hotspot"),
    ("under capacity pressure the store evicts (LRU) and stays within its capacity; reads hit "
     "only what it kept", "pressure"),
)


def case_row(run: dict, p: Any) -> dict[str, Any]:
    rows = run["rows"]
    reads = [r for r in rows if r["phase"] == "read"] or rows  # miss: the writes are the probes
    d = Dist.of([r["ttft"] for r in reads])
    tiers: dict[str, int] = {}
    for r in reads:
        for t, n in r["chunks"].items():
            tiers[t] = tiers.get(t, 0) + n
    net = sum(r["read_bytes"] for r in reads)
    net_s = sum(r["lookup_s"] + r["retrieve_s"] for r in reads if r["read_bytes"])
    load_s = sum(r["lookup_s"] + r["retrieve_s"] + r["h2d_s"] for r in reads)
    h2d = sum(r["h2d_bytes"] for r in reads)
    st = run["store"]
    return {"route": run["route"], "scenario": run["scenario"], "reads": len(reads),
            "hit_tokens": sum(r["hit"] for r in reads),
            "prompt_tokens": len(reads) * (p.doc_len + p.question_len),
            "chunks_by_tier": tiers,
            "cross_instance_chunks": sum(r["cross_instance_chunks"] for r in reads),
            "read_metadata_requests": sum(r["read_meta"] for r in reads),
            "write_metadata_requests": sum(r["write_meta"] for r in rows),
            "store_metadata_requests": st["metadata_requests"],
            "payload_read_mib": round(net / MiB, 1),
            "payload_written_mib": round(st["payload_written"] / MiB, 1),
            "network_gbps": round(net / net_s / 1e9, 2) if net_s else None,
            "delivered_gbps": round(h2d / load_s / 1e9, 2) if h2d else None,
            "ttft_p50_ms": _ms(d.p50), "ttft_p95_ms": _ms(d.p95), "ttft_p99_ms": _ms(d.p99),
            "store_evictions": st["evictions"],
            "store_used_mib": round(st["used_bytes"] / MiB, 1),
            "store_capacity_mib": round(st["capacity_bytes"] / MiB, 1),
            "metadata_ms": _ms(st["metadata_s"]), "transfer_ms": _ms(st["transfer_s"])}


def config_rows(p: Any, data: dict) -> list[dict[str, Any]]:
    seed = data["seeds"][0]
    out = []
    for r in ROUTES:
        run = data["runs"][r]["warm"][seed]
        out.append({"route": r, "path": "engine -> store connector -> store" if r == "direct"
                    else "engine -> cache layer (DRAM tier) -> store",
                    "chunk_tokens": run["chunk_tokens"], "meta_batch": run["meta_batch"] or
                    "one per lookup", "local_tier": "none" if r == "direct" else
                    f"pinned DRAM, {p.dram_docs} documents",
                    "save": "write-through to the store" if r == "direct" else
                    "write-through to DRAM and the store"})
    return out


def _miss_work(p: Any, run: dict, kvb: int) -> dict[str, int]:
    """The store's work on cold documents, from the route's configuration alone: per request
    one lookup (it misses at the first chunk) and the puts of every full chunk."""
    c, b = run["chunk_tokens"], run["meta_batch"]
    chunks = (p.doc_len + p.question_len) // c
    puts = 1 if b <= 0 else -(-chunks // b)
    return {"metadata_requests": p.docs * (1 + puts), "payload_read": 0,
            "payload_written": p.docs * chunks * c * kvb}


def checks(p: Any, data: dict, seed: int) -> dict[str, bool]:
    run = {(r, s): data["runs"][r][s][seed] for r in ROUTES for s in SCENARIOS}
    kvb = get_model(p.model).kv_bytes_per_token
    cross = all(x["hit"] > 0 and x["cross_instance_chunks"] == sum(x["chunks"].values())
                and set(x["chunks"]) == {"remote"}
                for r in ROUTES for x in run[r, "warm"]["rows"] if x["phase"] == "read")
    miss_equal = all(run[r, "miss"]["store"][k] == v for r in ROUTES
                     for k, v in _miss_work(p, run[r, "miss"], kvb).items())
    hot = {r: [x for x in run[r, "hotspot"]["rows"] if x["phase"] == "read"] for r in ROUTES}
    doc_bytes = (p.doc_len // p.chunk_tokens) * p.chunk_tokens * kvb
    i2_docs = {x["doc"] for x in hot["via-cache"] if x["instance"] == "i2"}
    hotspot = sum(x["read_bytes"] for x in hot["via-cache"]) == len(i2_docs) * doc_bytes and \
        sum(x["read_meta"] for x in hot["via-cache"]) < sum(x["read_meta"]
                                                            for x in hot["direct"]) and \
        Dist.of([x["ttft"] for x in hot["via-cache"]]).p50 < \
        Dist.of([x["ttft"] for x in hot["direct"]]).p50
    pressure = True
    for r in ROUTES:
        st = run[r, "pressure"]["store"]
        reads = [x for x in run[r, "pressure"]["rows"] if x["phase"] == "read"]
        hit_docs = sum(1 for x in reads if x["hit"])
        pressure &= st["evictions"] > 0 and st["used_bytes"] <= st["capacity_bytes"] and \
            hit_docs == min(p.store_docs, p.docs)
    return {"cross_instance": cross, "miss_equal": miss_equal, "hotspot": hotspot,
            "pressure": pressure}


def markdown(p: Any, data: dict, found: list[dict], tables: dict) -> str:
    lines = ["# Store routes: straight to the store, or through a cache layer (simulated)", "",
             f"Two vLLM-like {p.model} instances (prefix caching off) share one Mooncake-style "
             f"store, modelled as a metadata service ({p.meta_ms:g} ms per request) and a "
             f"transfer path ({p.remote_gbps:g} GB/s). Route A (*direct*): the engine's store "
             "connector. Route B (*via-cache*): an LMCache-style layer with a pinned-DRAM tier "
             "in front of the same store. Documents of "
             f"{p.doc_len} tokens plus a {p.question_len}-token question; seeds "
             f"{data['seeds']}, the case order reversed on odd seeds. Seed 003 E6. Neither "
             "system is measured: both are modelled from their documented designs.", "",
             *agreement_rows(EXPECT, found)]
    lines += ["", "## Configuration first (the seed: report differences before results)", "",
              "| route | path | chunk | metadata batching | local tier | save |",
              "|---|---|---|---|---|---|"]
    for c in tables["config"]:
        lines.append(f"| {c['route']} | {c['path']} | {c['chunk_tokens']} | {c['meta_batch']} "
                     f"| {c['local_tier']} | {c['save']} |")
    lines += ["", "## Cases (first seed; reads, or the cold requests for *miss*)", "",
              "| route | scenario | hit / prompt tokens | chunks by tier | cross-instance chunks "
              "| metadata req (reads / writes) | payload MiB (read / written) | network GB/s | "
              "delivered GB/s | TTFT p50 / p95 ms | store evictions | store used / capacity "
              "MiB |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in tables["cases"]:
        lines.append(f"| {r['route']} | {r['scenario']} | {r['hit_tokens']} / "
                     f"{r['prompt_tokens']} | {r['chunks_by_tier'] or '-'} | "
                     f"{r['cross_instance_chunks']} | {r['read_metadata_requests']} / "
                     f"{r['write_metadata_requests']} | {r['payload_read_mib']} / "
                     f"{r['payload_written_mib']} | {r['network_gbps'] or '-'} | "
                     f"{r['delivered_gbps'] or '-'} | {r['ttft_p50_ms']} / {r['ttft_p95_ms']} | "
                     f"{r['store_evictions']} | {r['store_used_mib']} / "
                     f"{r['store_capacity_mib']} |")
    lines += ["", "## Reading it", "",
              "* The master's work (metadata requests: lookups and puts) and the transfer "
              "path's work (payload bytes) are counted apart, as the seed asks: a lookup that "
              "finds nothing still costs a request; a hit costs a request and the payload.",
              "* *Network GB/s* is payload over (metadata + transfer) time of the reads that "
              "crossed the network: below the link's rate because every read also waits for its "
              "lookup. *Delivered GB/s* is KV bytes put into HBM over the whole load time: the "
              "cache layer raises it on a hot spot, because repeats come from local DRAM.",
              "* What the cache layer adds: a local tier (hits without the network, cross-"
              "process reuse on one host), a second copy on every save, and host memory. What "
              "it does not change: the store's own work when nothing is reused (*miss*), and "
              "the first read of another instance's data (*warm*).",
              "* Under pressure the store evicts least recently used chunks (a chain's tail "
              "before its head); reads newest first find exactly what it kept. Read in write "
              "order, LRU would keep evicting the next document before it is read.",
              "* By default the routes differ only in the local tier; set `direct_chunk` or "
              "`direct_meta_batch` to add the configuration differences real deployments have. "
              "Only a modelled TCP-class path is represented; no RDMA path is claimed."]
    return "\n".join(lines) + "\n"


def figures(tables: dict) -> dict[str, Any]:
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    cases = tables["cases"]
    meta = grouped_bars(go, cases, "route", "scenario", "store_metadata_requests", ROUTES,
                        title="metadata requests at the store's master")
    payload = grouped_bars(go, cases, "route", "scenario", "payload_read_mib", ROUTES,
                           title="payload read over the transfer path", yaxis_title="MiB")
    return {"metadata_requests": meta, "payload_read": payload}


def build(p: Any, data: dict, backend: str) -> LabResult:
    seed = data["seeds"][0]
    tables = {"config": config_rows(p, data),
              "cases": [case_row(data["runs"][r][s][seed], p) for r in ROUTES
                        for s in SCENARIOS]}
    found = [checks(p, data, s) for s in data["seeds"]]
    tables["checks"] = [dict(f, seed=s) for f, s in zip(found, data["seeds"], strict=True)]
    return LabResult(record(p, data, found, tables, backend), markdown(p, data, found, tables),
                     tables=tables, figures=figures(tables))


def record(p: Any, data: dict, found: list[dict], tables: dict, backend: str) -> LabRecord:
    key = {f"{r['route']}/{r['scenario']}": r for r in tables["cases"]}
    return LabRecord(
        experiment_id=f"store-routes-{p.model}",
        hypothesis="a cache layer in front of a shared store serves repeated reads locally "
                   "(fewer metadata requests and payload bytes) and adds nothing when nothing "
                   "is reused; cross-instance reads work on both routes",
        environment={"backend": backend, "seeds": data["seeds"],
                     "command": "workbench labs run store-routes --backend sim",
                     "modelled": "Mooncake-style store, LMCache-style layer; not measured"},
        model_io={"model": p.model, "doc": p.doc_len, "question": p.question_len,
                  "output": p.output_len},
        cache_state="per scenario: miss (cold), warm (written by the other instance), hotspot, "
                    "pressure (store smaller than the documents)",
        load={"spacing_s": p.spacing_s, "instances": 2},
        samples={"seeds": data["seeds"], "order": data["order"]},
        outcomes={k: v["reads"] for k, v in key.items()},
        ttft=ttft_percentiles(key),
        tpot_itl={"note": "decode is unchanged by the routes; not reported"}, e2e={},
        throughput={}, slo_goodput={},
        hits={k: {"hit_tokens": v["hit_tokens"], "denominator_prompt_tokens": v["prompt_tokens"],
                  "cross_instance_chunks": v["cross_instance_chunks"]} for k, v in key.items()},
        transfer_bytes={k: {"read_mib": v["payload_read_mib"],
                            "written_mib": v["payload_written_mib"],
                            "network_gbps": v["network_gbps"],
                            "delivered_gbps": v["delivered_gbps"]} for k, v in key.items()},
        phase_times={k: {"metadata_ms": v["metadata_ms"], "transfer_ms": v["transfer_ms"]}
                     for k, v in key.items()},
        kv={"checks": found, "config": tables["config"]},
        correctness="exact-prefix reuse only (chained chunk keys)",
        raw_data={"cases": "results.cases"},
        verdict=checks_verdict(found),
        mechanism="the store's master answers every lookup and put; the transfer path moves "
                  "every remote byte; a local tier removes both for repeats",
        open_questions=["no RDMA path is modelled", "the routes' real default chunk sizes and "
                        "save policies depend on versions: set them before comparing"],
        applicability="two instances on one simulated store, one request at a time",
        manifest=Manifest.collect(
            hardware={"gpu": f"simulated {p.gpu}", "network": f"{p.remote_gbps:g} GB/s modelled"},
            engine_config={"engine": "vllm-like (sim)", "model": p.model},
            kvcached_config={"chunk_tokens": p.chunk_tokens, "store_docs": p.store_docs,
                             "dram_docs": p.dram_docs}),
        results={"config": tables["config"], "cases": tables["cases"]})
