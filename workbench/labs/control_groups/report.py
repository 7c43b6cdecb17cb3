"""The control-groups lab's record, Markdown and figures (seed 000 §14, seed 003 §12)."""

from __future__ import annotations

from typing import Any

from workbench.labs.kit.kvcached import KVCACHED
from workbench.labs.kit.record import LabRecord, Manifest
from workbench.labs.kit.report import grouped_bars, lat_cell, without_repeats

SEED_EXPECTED = (
    "Seed 000 §14 asks for five control groups (A native static split; B KVCacheD without "
    "preallocation or prefix cache; C with preallocation; D with a bounded prefix cache; E with "
    "an unlimited one), measured by TTFT p50/p95/p99, ITL, E2E and throughput rather than mean "
    "throughput alone. It warns that the README's 2-28x TTFT comes from one specific experiment "
    "(three models on an A100-80G with intermittent, staggered peaks) and is not a fixed speedup "
    "for other models or workloads; a reproduction must keep that workload's structure. Its "
    "prefix-bound section adds that an unlimited cache has the most reuse and the weakest "
    "elasticity.")

WHY = """## Why the 2-28x belongs to its workload

* **Staggered peaks are the lever.** In ``readme`` one instance peaks while the other two idle.
  Group A's static split caps the peaking instance at a third of the KV memory; it preempts and
  queues, so its tail explodes. C lets it map the pages its idle neighbours do not use. The gain
  is in the tail (p99), not the median: most requests arrive off-peak, where both fit.
* **No idle neighbour, no gain.** In ``simultaneous`` the three ramps coincide: all instances
  want memory (and the GPU's compute) at once, and elastic KV cannot create either. A to E land
  within a few percent of each other.
* **The multiplier moves with PEAK.** kvcached's own table runs from 0.9x (PEAK 12, nothing to
  gain) to 28x (p99, PEAK 16) and back to 1.2x (PEAK 20, compute-bound); the colocation lab
  sweeps it. Any single number is one point of that curve on that GPU, model and trace.
* **The prefix-cache setting can undo it.** E keeps every computed block cached: on random
  prompts nothing is ever reused, yet the cache holds pages that the peaking neighbour needs,
  so E can be worse than the static split. D's bound keeps the elasticity; with shared prefixes
  (``shared_prefix``) D gets the hits *and* the elasticity.
* **A-C do not read token contents**: without a prefix cache ``shared_prefix`` gives them the
  same numbers as ``readme`` (same arrivals, same lengths), a built-in control.
* **Preallocation** (B vs C) moves VMM map latency off the step path (the step-path VMM column);
  with kvcached's A100 latencies it is a small TTFT effect at this load.

## What differs from a real deployment

* Step times are the hand fit ``kvcached-fit`` (HBM at 55%, 5 ms per step), not measured vLLM.
* No API server, IPC round trips or CPU contention between the three engine processes.
* The ramp's arrival times are deterministic; repeats with other seeds change only token ids.
"""


def _hit(r: dict) -> str:
    return f"{r['prefix_hit_tokens'] / r['prompt_tokens']:.0%}" if r["prompt_tokens"] else "-"


def markdown(params: Any, rows: list[dict]) -> str:
    from workbench.labs.control_groups.sim import GROUP_TEXT

    peak = params.peak
    pub = {k: KVCACHED[k].get(peak) for k in ("mean_speedup", "p99_speedup")}
    md = ["# Control groups A-E (simulated)", "",
          f"Three vLLM-like Llama-3.1-8B instances on one simulated A100-80G, kvcached's ramp at "
          f"PEAK {peak} req/s. Step times: {params.steptime or 'roofline'}. SLO: TTFT <= 1 s, "
          "TPOT <= 100 ms. Latencies in ms as p50 / p95 / p99; *x A* = group A's TTFT over "
          "this group's (above 1: faster than the static split).", "",
          "## Seed's expected result", "", SEED_EXPECTED, "",
          f"kvcached's published speedup at PEAK {peak}: mean {pub['mean_speedup']}x, "
          f"p99 {pub['p99_speedup']}x (elastic vs static).", "", "## Measured", ""]
    for kind in dict.fromkeys(r["workload"] for r in rows):
        c = next(r for r in rows if r["workload"] == kind and r["group"] == "C")
        md.append(f"* `{kind}`: C vs A TTFT p50 {c['ttft_p50_vs_A']}x, p99 "
                  f"{c['ttft_p99_vs_A']}x, mean {c['ttft_mean_vs_A']}x.")
    for kind in dict.fromkeys(r["workload"] for r in rows):
        md += ["", f"### `{kind}`", "",
               "| group | setting | TTFT | ITL | E2E p99 | goodput | in SLO | preemptions | "
               "prefix hits | step VMM s | x A p50 / p99 / mean |", "|" + "---|" * 11]
        for r in (r for r in rows if r["workload"] == kind):
            md.append(f"| {r['group']} | {GROUP_TEXT[r['group']]} | {lat_cell(r['ttft_ms'])} | "
                      f"{lat_cell(r['itl_ms'])} | {r['e2e_ms']['p99']:,.0f} | "
                      f"{r['goodput_req_per_s']:g} | {r['slo_attainment']:.0%} | "
                      f"{r['preemptions']} | {_hit(r)} | {r['step_vmm_s']} | "
                      f"{r['ttft_p50_vs_A']} / {r['ttft_p99_vs_A']} / {r['ttft_mean_vs_A']} |")
    md += ["", WHY]
    return "\n".join(md) + "\n"


def record(params: Any, rows: list[dict], backend: str) -> LabRecord:
    table = without_repeats(rows)

    def by(key: str) -> dict:
        return {f"{r['workload']}/{r['group']}": r[key] for r in rows}

    readme = {r["group"]: r for r in rows if r["workload"] == "readme"}
    sim = {r["group"]: r for r in rows if r["workload"] == "simultaneous"}
    holds = bool(readme and sim) and readme["C"]["ttft_p99_vs_A"] >= 2 and \
        0.8 <= sim["C"]["ttft_p99_vs_A"] <= 1.25
    return LabRecord(
        experiment_id=f"control-groups-peak{params.peak}",
        hypothesis="elastic KV (C) beats the static split (A) in the tail only where peaks are "
                   "staggered; an unlimited prefix cache (E) gives the elasticity back",
        environment={"backend": backend, "seed": params.seed, "quick": params.quick,
                     "steptime": params.steptime,
                     "command": "workbench labs run control-groups --backend sim"},
        model_io={"model": "llama-3.1-8b", "instances": 3, "input_tokens": 256,
                  "output_tokens": 256, "shared_prefix": "192 system + 64 unique tokens"},
        cache_state="prefix caching only in D (bounded) and E (unlimited)",
        load={"trace": "kvcached ramp", "peak": params.peak,
              "workloads": list(dict.fromkeys(r["workload"] for r in rows))},
        samples={"requests": by("requests"), "repeats": {k: [x["seed"] for x in v] for k, v in
                                                        by("repeats").items()},
                 "order": "groups A..E on even repeats, E..A on odd"},
        outcomes={"finished": by("finished"), "misses": by("misses")},
        ttft=by("ttft_ms"), tpot_itl={"itl_ms": by("itl_ms"), "tpot_ms": by("tpot_ms")},
        e2e=by("e2e_ms"), throughput={},
        slo_goodput={"slo": "TTFT <= 1 s and TPOT <= 100 ms",
                     "goodput_req_per_s": by("goodput_req_per_s"),
                     "attainment": by("slo_attainment")},
        hits={"prefix_hit_tokens": by("prefix_hit_tokens"),
              "denominator_prompt_tokens": by("prompt_tokens")},
        transfer_bytes=None, phase_times={"step_vmm_s": by("step_vmm_s")},
        kv={"preemptions": by("preemptions"), "misses": by("misses")}, correctness=None,
        raw_data={}, verdict=("supported: " if holds else "not supported: ") +
        "; ".join(f"{k} C p99 x A = {v['C']['ttft_p99_vs_A']}" for k, v in
                  (("readme", readme), ("simultaneous", sim)) if v),
        mechanism="a static split caps the peaking instance; elastic pools lend idle "
                  "neighbours' pages; an unbounded cache keeps pages no one lends",
        open_questions=["step time is a hand fit to kvcached's table, not a measurement",
                        "one PEAK; the colocation lab sweeps PEAK 12-20"],
        applicability=f"3 x Llama-3.1-8B, one A100-80G, ramp PEAK {params.peak}; the "
                      "multipliers are this workload's, not a constant",
        manifest=Manifest.collect(
            hardware={"gpu": "simulated a100-80g", "count": 1},
            engine_config={"engine": "vllm-like", "model": "llama-3.1-8b", "instances": 3,
                           "static_gpu_memory_utilization": 0.31, "block_size": 16},
            kvcached_config={"gpu_utilization": 0.95, "prealloc": "B off, C-E on",
                             "min_reserved_pages": 5, "max_reserved_pages": 10,
                             "max_cached_tokens": {"D": params.cached_tokens, "E": -1}},
            backend=backend),
        results={"cells": table, "kvcached_published": {k: KVCACHED[k].get(params.peak)
                                                        for k in KVCACHED}})


def figures(rows: list[dict]) -> dict[str, Any]:
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    fig = grouped_bars(go, rows, "workload", "group", lambda r: r["ttft_ms"]["p99"],
                       yaxis_type="log", yaxis_title="TTFT p99 (ms)",
                       xaxis_title="control group", title="TTFT p99 per group and workload")
    return {"ttft_p99": fig}
