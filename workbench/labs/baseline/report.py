"""The baseline lab's record, Markdown and figures (seed 003 E1, §12)."""

from __future__ import annotations

from typing import Any

from workbench.engines.sim.workloads import MIX_CLASSES
from workbench.labs.kit.record import LabRecord, Manifest
from workbench.labs.kit.report import lat_cell, without_repeats

SEED_EXPECTED = (
    "Seed 003 E1 expects a load-latency-throughput curve with a clearly stated stable operating "
    "range under an SLO, not only the maximum tokens/s: latency stays near its single-request "
    "value at low load, then queueing takes over as the rate approaches what the instance can "
    "serve, and throughput stops following the offered rate. Open-loop rate sweeps are kept "
    "apart from closed-loop concurrency curves.")

EXPLAIN = """## Reading it

* **Below the knee** TTFT is one prefill plus a short wait; TPOT grows slowly because each decode
  step carries more sequences (the step streams the weights once, whatever the batch).
* **Near the knee** the instance still keeps up on average, but TPOT and TTFT approach the SLO:
  long prompts share each step's token budget with the decodes (a step carrying a 2048-token
  prefill chunk takes ~190 ms: the ITL p99), and bursts of the Poisson process queue.
* **Past saturation** requests arrive faster than they leave: the queue and with it TTFT grow
  with the run's length (a longer run gives a larger p99), while output tokens/s stays flat at
  the instance's capacity. The p99 past that point describes this run, not the system.

## What differs from a real server

* The step time is the uncalibrated roofline of `workbench.engines.sim.steptime` (A100 at
  80% of HBM bandwidth, 60% of peak FLOP/s, 2.5 ms per step); the knee's rate moves with it.
* TTFT here has no API server, tokenizer or network: the seed's client-side TTFT adds those.
* Outputs always run to their length (no EOS), so the length distribution is exact (§2.4).
* No CPU contention, no CUDA-graph warmup: a simulated engine is warm from its first step.
"""


def markdown(params: Any, rows: list[dict], k: dict) -> str:
    ins = ", ".join(f"{c} {MIX_CLASSES[c][0]}/{MIX_CLASSES[c][1]}" for c in MIX_CLASSES)
    load = "equal thirds of " + ins if params.workload == "mix" else \
        f"{params.workload} {MIX_CLASSES[params.workload][0]}/{MIX_CLASSES[params.workload][1]}"
    n = rows[0]["requests"] if rows else 0
    md = ["# Baseline: one instance's latency-throughput curve (simulated)", "",
          f"{params.engine}-like {params.model} on a simulated {params.gpu}, static KV split "
          f"(gpu_memory_utilization 0.9). Load: {load} (input/output tokens), Poisson arrivals. "
          f"{n} requests per rate (repeats pooled). SLO: TTFT <= {params.slo_ttft_s * 1e3:.0f} "
          f"ms and TPOT <= {params.slo_tpot_s * 1e3:.0f} ms.", "",
          "## Seed's expected result", "", SEED_EXPECTED, "", "## Measured", "",
          f"* **Knee** (highest rate with >= {params.stable_attainment:.0%} of requests in SLO): "
          f"{_rate(k['knee_rate'])}.",
          f"* **Saturation** (first rate where requests finish at < "
          f"{params.saturation_ratio:.0%} of their arrival rate in the steady window): "
          f"{_rate(k['saturation_rate'])}.",
          f"* Highest output throughput: {k['max_output_tok_per_s']:,.0f} tok/s.", "",
          "Latencies in ms as p50 / p95 / p99.", "",
          "| rate (req/s) | sent | steady ratio | TTFT | TPOT | ITL | E2E | queue p99 | out tok/s "
          "| goodput | in SLO | stable | saturated |", "|" + "---|" * 13]
    for r in rows:
        md.append(f"| {r['rate']:g} | {r['sent_req_per_s']:g} | {r['steady_ratio']} | "
                  f"{lat_cell(r['ttft_ms'])} | {lat_cell(r['tpot_ms'])} | "
                  f"{lat_cell(r['itl_ms'])} | "
                  f"{lat_cell(r['e2e_ms'])} | {r['queue_ms']['p99']:,.0f} | "
                  f"{r['output_tok_per_s']:,.0f} | {r['goodput_req_per_s']:g} | "
                  f"{r['slo_attainment']:.0%} | {'yes' if r['stable'] else 'no'} | "
                  f"{'yes' if r['saturated'] else 'no'} |")
    md += ["", "*steady ratio*: requests finished / arrived per second over the middle half of "
           "the arrival window (1 = keeping up). *sent*: the actual send rate of the run.", "",
           EXPLAIN]
    return "\n".join(md) + "\n"


def _rate(x: float | None) -> str:
    return "not reached in this sweep" if x is None else f"{x:g} req/s"


def record(params: Any, rows: list[dict], k: dict, backend: str) -> LabRecord:
    def per_rate(key: str) -> dict:
        return {f"{r['rate']:g}": r[key] for r in rows}

    return LabRecord(
        experiment_id=f"baseline-{params.workload}-{params.model}-{params.gpu}",
        hypothesis="latency stays flat until the instance nears its capacity, then queueing "
                   "makes TTFT grow while throughput plateaus; the stable range is stated by rule",
        environment={"backend": backend, "seed": params.seed, "quick": params.quick,
                     "command": f"workbench labs run baseline --param workload={params.workload}"},
        model_io={"model": params.model, "workload": params.workload,
                  "classes": {c: {"input": i, "output": o} for c, (i, o) in MIX_CLASSES.items()},
                  "output_lengths": "exact (no EOS)"},
        cache_state="prefix caching off; warm engine (no cold start in simulation)",
        load={"arrival": "Poisson, open loop", "rates": [r["rate"] for r in rows],
              "actual_send_rate": per_rate("sent_req_per_s")},
        samples={"requests_per_rate": rows[0]["requests"] if rows else 0,
                 "repeats": {f"{r['rate']:g}": [x["seed"] for x in r["repeats"]] for r in rows},
                 "order": "ascending rates on even repeats, descending on odd"},
        outcomes={"finished": per_rate("finished"), "rejected": per_rate("rejected"),
                  "failed": 0},
        ttft=per_rate("ttft_ms"), tpot_itl={"tpot_ms": per_rate("tpot_ms"),
                                            "itl_ms": per_rate("itl_ms")},
        e2e=per_rate("e2e_ms"),
        throughput={"req_per_s": per_rate("req_per_s"),
                    "input_tok_per_s": per_rate("input_tok_per_s"),
                    "output_tok_per_s": per_rate("output_tok_per_s")},
        slo_goodput={"slo": f"TTFT <= {params.slo_ttft_s} s and TPOT <= {params.slo_tpot_s} s",
                     "goodput_req_per_s": per_rate("goodput_req_per_s"),
                     "attainment": per_rate("slo_attainment")},
        hits={"local": 0, "denominator": "prefix caching off"}, transfer_bytes=None,
        phase_times={"queue_ms": per_rate("queue_ms")},
        kv={"preemptions": per_rate("preemptions"), "peak_kv_use": per_rate("peak_kv_use")},
        correctness=None, raw_data={"per_repeat": {f"{r['rate']:g}": r["repeats"]
                                                   for r in rows}},
        verdict=f"knee {_rate(k['knee_rate'])}, saturation {_rate(k['saturation_rate'])}",
        mechanism="each step streams the weights once and shares a token budget between "
                  "prefill chunks and decodes; past capacity the waiting queue grows",
        open_questions=["step time uncalibrated (roofline); the knee's rate depends on it",
                        "no API-server/tokenizer latency; no EOS length variation"],
        applicability=f"one {params.gpu} instance, {params.model}, this load mix only",
        manifest=Manifest.collect(
            hardware={"gpu": f"simulated {params.gpu}", "count": 1},
            engine_config={"engine": f"{params.engine}-like", "model": params.model,
                           "block_size": 16, "max_num_batched_tokens": 2048,
                           "max_num_seqs": 256, "chunked_prefill": True,
                           "prefix_caching": False, "gpu_memory_utilization": 0.9},
            kvcached_config={"kv": "static split (no KVCacheD)"}, backend=backend),
        results={"rates": without_repeats(rows),
                 "knee": k})


def figures(rows: list[dict], k: dict) -> dict[str, Any]:
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    curve = go.Figure()
    x = [r["output_tok_per_s"] for r in rows]
    for stat in ("p50", "p99"):
        curve.add_scatter(x=x, y=[r["ttft_ms"][stat] for r in rows], name=f"TTFT {stat}",
                          mode="lines+markers", text=[f"{r['rate']:g} req/s" for r in rows])
    curve.update_layout(xaxis_title="output tokens/s", yaxis_title="TTFT (ms)",
                        yaxis_type="log", title="latency vs throughput")
    by_rate = go.Figure()
    rates = [r["rate"] for r in rows]
    for key, name in (("itl_ms", "ITL p99"), ("tpot_ms", "TPOT p99"), ("e2e_ms", "E2E p99")):
        by_rate.add_scatter(x=rates, y=[r[key]["p99"] for r in rows], name=name,
                            mode="lines+markers")
    for rate, label in ((k["knee_rate"], "knee"), (k["saturation_rate"], "saturation")):
        if rate is not None:
            by_rate.add_vline(x=rate, line_dash="dash", annotation_text=label)
    by_rate.update_layout(xaxis_title="offered rate (req/s)", yaxis_title="ms",
                          yaxis_type="log", title="tail latency vs rate")
    return {"curve": curve, "by_rate": by_rate}
