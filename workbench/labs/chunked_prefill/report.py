"""The chunked-prefill lab's verdict, record, Markdown and figures (seed 003 E3, §12)."""

from __future__ import annotations

from typing import Any

from workbench.labs.kit.record import LabRecord, Manifest
from workbench.labs.kit.report import lat_cell, without_repeats

SEED_EXPECTED = (
    "Seed 003 E3 expects long prompts injected among running decodes to disturb them: the "
    "decoding requests' ITL shows spikes aligned with long prefills. Chunking the prefill under "
    "a token budget trades those spikes against the long prompts' TTFT; a larger budget is more "
    "efficient per step but lengthens each step and the tail. The conclusion must name the "
    "lengths and arrival rates it holds for, never 'larger is better' or 'smaller is better'.")

EXPLAIN = """## Why it comes out this way

* **Off**: a 4096-token prompt is computed in one step of ~0.4 s (compute-bound prefill on the
  simulated A100). Every running decode waits for that step: its gap (ITL) is the whole step.
  How often a decoding request meets one depends on the long prompts' rate, so the ITL p99 is
  small at low rates (spikes are under 1% of gaps) and huge once they are more common, while the
  *worst gap per request* shows the spike at every rate.
* **On with budget B**: a step carries at most B tokens, so the worst gap is about the time of a
  B-token step. The long prompt needs ``4096 / B`` steps instead of one, and each step also
  streams the weights and carries the decodes: its TTFT pays that overhead, more at small B.
* **Budget 4096 and 8192** let a whole long prompt into one step again: the spikes come back.
* **Short requests' TTFT** does not improve with small budgets here: the scheduler serves
  running requests first, so a short prompt waits while a long prompt's chunks take the budget.
* **Efficiency**: a larger budget means fewer, longer steps (the step count and mean step time
  columns); goodput under the default SLO (TTFT <= 1 s, TPOT <= 100 ms) barely moves, since
  TPOT averages the spikes away: the smooth-streaming share is where the trade-off shows.

## What differs from a real server

* Roofline step time (uncalibrated); a real prefill kernel's cost and the budget's sweet spot
  move with the GPU, the attention backend and CUDA graphs.
* No profiler alignment of kernels with ITL spikes (the seed's step 5): the simulator knows each
  step's content exactly, so the worst-gap column stands in for it.
"""


def verdict(rows: list[dict]) -> dict[str, Any]:
    """Per rate: off against the smallest budget (ratios of the two sides of the trade)."""
    out = {}
    for rate in sorted({r["rate"] for r in rows}):
        sel = [r for r in rows if r["rate"] == rate]
        off = next(r for r in sel if not r["chunked"])
        small = min((r for r in sel if r["chunked"]), key=lambda r: r["budget"])
        out[f"{rate:g}"] = {
            "off_vs": small["config"],
            "worst_itl_p99_ratio": round(off["decode_worst_itl_ms"]["p99"]
                                         / small["decode_worst_itl_ms"]["p99"], 2),
            "itl_p99_ratio": round(off["decode_itl_ms"]["p99"] / small["decode_itl_ms"]["p99"],
                                   2),
            "long_ttft_p50_ratio": round(small["long_ttft_ms"]["p50"]
                                         / off["long_ttft_ms"]["p50"], 3)}
    return out


def markdown(params: Any, rows: list[dict]) -> str:
    v = verdict(rows)
    md = ["# Chunked prefill: long prompts' TTFT against decodes' ITL (simulated)", "",
          f"vLLM-like llama-3.1-8b, simulated A100-80G, static KV. Poisson mix: "
          f"{params.long_share:.0%} long prompts (4096 in / 128 out), the rest split between "
          "128/128 and 128/1024 decoding requests. Latencies in ms as p50 / p95 / p99.", "",
          "## Seed's expected result", "", SEED_EXPECTED, "", "## Measured", ""]
    for rate, x in v.items():
        md.append(f"* {rate} req/s, off vs {x['off_vs']}: decoding requests' worst gap p99 "
                  f"{x['worst_itl_p99_ratio']}x higher with chunking off, ITL p99 "
                  f"{x['itl_p99_ratio']}x; long prompts' TTFT p50 {x['long_ttft_p50_ratio']}x "
                  "with chunking on.")
    for rate in sorted({r["rate"] for r in rows}):
        md += ["", f"### {rate:g} req/s", "",
               "| config | long TTFT | decode ITL | decode worst gap | smooth | decode TTFT "
               "p99 | goodput | steps | mean step ms |", "|" + "---|" * 9]
        for r in (r for r in rows if r["rate"] == rate):
            md.append(f"| {r['config']} | {lat_cell(r['long_ttft_ms'])} | "
                      f"{lat_cell(r['decode_itl_ms'])} | {lat_cell(r['decode_worst_itl_ms'])} | "
                      f"{r['smooth_share']:.0%} | {r['decode_ttft_ms']['p99']:,.0f} | "
                      f"{r['goodput_req_per_s']:g} | {r['steps']:,} | {r['mean_step_ms']} |")
    md += ["", f"*decode worst gap*: each decoding request's largest ITL; *smooth*: share of "
           f"decoding requests whose largest gap is <= {params.itl_slo_ms:g} ms.", "", EXPLAIN]
    return "\n".join(md) + "\n"


def record(params: Any, rows: list[dict], backend: str) -> LabRecord:
    table = without_repeats(rows)

    def by(key: str) -> dict:
        return {f"{r['rate']:g}/{r['config']}": r[key] for r in rows}

    v = verdict(rows)
    holds = all(x["worst_itl_p99_ratio"] > 1 and x["long_ttft_p50_ratio"] > 1
                for x in v.values())
    return LabRecord(
        experiment_id="chunked-prefill-long-short-mix",
        hypothesis="with chunking off, long prefills stall running decodes (ITL spikes); "
                   "chunking under a token budget removes the spikes and long prompts' TTFT pays",
        environment={"backend": backend, "seed": params.seed, "quick": params.quick,
                     "command": "workbench labs run chunked-prefill --backend sim"},
        model_io={"model": "llama-3.1-8b", "long": "4096/128", "decoding": "128/128, 128/1024",
                  "long_share": params.long_share, "output_lengths": "exact (no EOS)"},
        cache_state="prefix caching off",
        load={"arrival": "Poisson, open loop", "rates": sorted({r["rate"] for r in rows})},
        samples={"requests_per_config": table[0]["long_requests"] + table[0]["decode_requests"]
                 if table else 0, "repeats": by("repeats"),
                 "order": "configurations alternate direction between repeats"},
        outcomes={"preemptions": by("preemptions")},
        ttft={"long": by("long_ttft_ms"), "decoding": by("decode_ttft_ms")},
        tpot_itl={"decode_itl_ms": by("decode_itl_ms"),
                  "decode_worst_itl_ms": by("decode_worst_itl_ms")},
        e2e={"long": by("long_e2e_ms")}, throughput={"output_tok_per_s": by("output_tok_per_s")},
        slo_goodput={"slo": "TTFT <= 1 s and TPOT <= 100 ms",
                     "goodput_req_per_s": by("goodput_req_per_s"),
                     "smooth_streaming": f"max ITL <= {params.itl_slo_ms:g} ms",
                     "smooth_share": by("smooth_share")},
        hits={"local": 0, "denominator": "prefix caching off"}, transfer_bytes=None,
        phase_times={"mean_step_ms": by("mean_step_ms"), "steps": by("steps")},
        kv={"preemptions": by("preemptions")}, correctness=None, raw_data={},
        verdict=("supported: " if holds else "not supported at every rate: ") + "; ".join(
            f"{rate} req/s worst gap {x['worst_itl_p99_ratio']}x, long TTFT "
            f"{x['long_ttft_p50_ratio']}x" for rate, x in v.items()),
        mechanism="a step's duration grows with the tokens it carries; every running decode "
                  "waits for the whole step",
        open_questions=["roofline step time: the best budget depends on the real kernels",
                        "short prompts queue behind long chunks (running-first scheduling)"],
        applicability="one instance; 4096-token long prompts at the listed rates and share",
        manifest=Manifest.collect(
            hardware={"gpu": "simulated a100-80g", "count": 1},
            engine_config={"engine": "vllm-like", "model": "llama-3.1-8b", "block_size": 16,
                           "max_num_seqs": 256, "budgets": list(params.budgets),
                           "off_budget": 8192, "prefix_caching": False},
            kvcached_config={"kv": "static split (no KVCacheD)"}, backend=backend),
        results={"configs": table, "verdict": v})


def figures(rows: list[dict]) -> dict[str, Any]:
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    fig = go.Figure()
    for rate in sorted({r["rate"] for r in rows}):
        sel = [r for r in rows if r["rate"] == rate]
        fig.add_scatter(x=[r["decode_worst_itl_ms"]["p99"] for r in sel],
                        y=[r["long_ttft_ms"]["p50"] for r in sel], mode="markers+text",
                        text=[r["config"] for r in sel], textposition="top center",
                        name=f"{rate:g} req/s")
    fig.update_layout(xaxis_title="decoding requests' worst gap p99 (ms)",
                      yaxis_title="long prompts' TTFT p50 (ms)", xaxis_type="log",
                      title="the trade: smooth decodes vs fast long prompts")
    return {"tradeoff": fig}
