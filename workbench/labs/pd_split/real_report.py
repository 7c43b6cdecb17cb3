"""pd-split's real run (host, gpu): summary, Markdown and record of the handover against the
colocated engine (the run itself is :mod:`workbench.labs.pd_split.real`)."""

from __future__ import annotations

from statistics import median
from typing import Any

from workbench.backends import capabilities
from workbench.labs.kit.record import LabRecord, Manifest

SHARED_NOTE = ("**PD and colocated share one device here**: this run shows the handover's "
               "mechanism and cost (bytes, transfer time, tokens unchanged), not PD's "
               "performance advantage, which needs the prefill and decode engines on separate "
               "GPUs under load (the sim backend's sweep models that).")

EXPLAIN = """## What the handover does

1. The prefill engine computes the prompt and samples the first token; its request leaves the
   prefill batch with its blocks still held.
2. The decode engine admits the request with the prompt and that token; its scheduler allocates
   blocks in the decode pool (VMM-backed), and the connector hook copies the prompt's blocks into
   them: a gather on the source device, one copy (device-to-device across GPUs, within the device
   on one GPU, a host copy on `host`), a scatter into the decode blocks, waited on with events.
3. Only then the prefill engine releases its blocks. The decode engine's next step is a plain
   decode of the first token: no prompt token is computed twice.

Unlike the simulated handover (all prompt tokens but the last; the decode side recomputes it to
sample the first token, as vLLM's connectors do), this one keeps the prefill side's first token
and copies every prompt token's KV, whole blocks (the last one partly filled). Requests run one at
a time and both engines step in one thread, so the split isolates the handover at low load; it
does not show two GPUs working at once.
"""


def summary(run: dict[str, Any]) -> dict[str, Any]:
    rows = run["rows"]
    moved = [r for r in rows if r["blocks"]]
    exact = all(r["transfer_bytes"] == r["blocks"] * run["block_bytes"] for r in moved)
    seconds = sum(r["pd_ms"]["transfer"] for r in moved) / 1e3
    nbytes = sum(r["transfer_bytes"] for r in moved)
    return {"tokens_equal": all(r["tokens_equal"] for r in rows),
            "bytes_are_blocks_x_block_bytes": exact and bool(moved),
            "transfer_bytes": nbytes,
            "transfer_GBps": round(nbytes / seconds / 1e9, 3) if seconds else None,
            "extra_ttft_ms_median": round(median(r["pd_ms"]["ttft"] - r["colocated_ms"]["ttft"]
                                                 for r in rows), 3),
            "leaked_blocks": sum(run["leaked_blocks"].values())}


def markdown(run: dict[str, Any], backend: str) -> str:
    s = summary(run)
    md = ["# PD disaggregation: the real handover vs one colocated engine", "",
          f"Backend `{backend}`, model `{run['model']}` (random weights), block "
          f"{run['block_bytes']:,} bytes (every layer's K and V of 16 tokens). "
          f"Placement: {run['placement']}.", ""]
    if run["shared"]:
        md += [SHARED_NOTE, ""]
    md += [f"* **Tokens equal** (PD vs colocated, greedy): {'yes' if s['tokens_equal'] else 'no'}.",
           f"* **Transfer**: {s['transfer_bytes']:,} bytes in all, "
           f"{'=' if s['bytes_are_blocks_x_block_bytes'] else '!='} blocks x block bytes; "
           f"effective bandwidth {s['transfer_GBps']} GB/s (gather + copy + scatter, waited on).",
           f"* **TTFT**: PD's minus colocated's, median over the requests: "
           f"{s['extra_ttft_ms_median']:+.2f} ms (each request runs once per side, the side "
           "that goes first alternating; on a shared CPU the noise can exceed the transfer).",
           f"* Blocks left allocated after the run (all engines): {s['leaked_blocks']}.", "",
           "Times in ms. PD's TTFT = prefill + decode wait (handed over, not yet admitted) + "
           "transfer: the decode engine serves the stream and holds the first token once the KV "
           "has landed. *first decode step*: the decode engine's step that writes the first "
           "token's KV and samples the second. *decode*: from the first token to the last.", "",
           "| prompt | tokens equal | colocated TTFT | PD prefill | decode wait | transfer | PD "
           "TTFT | first decode step | colocated decode | PD decode | blocks | bytes | GB/s |",
           "|" + "---|" * 13]
    for r in run["rows"]:
        c, p = r["colocated_ms"], r["pd_ms"]
        md.append(f"| {r['prompt_len']} | {'yes' if r['tokens_equal'] else 'NO'} | "
                  f"{c['ttft']:.2f} | {p['prefill']:.2f} | {p['decode_wait']:.2f} | "
                  f"{p['transfer']:.3f} | {p['ttft']:.2f} | {p['first_decode_step']:.2f} | "
                  f"{c['decode']:.1f} | {p['decode']:.1f} | {r['blocks']} | "
                  f"{r['transfer_bytes']:,} | {r['transfer_GBps']} |")
    return "\n".join(md + ["", EXPLAIN]) + "\n"


def record(params: Any, run: dict[str, Any], backend: str) -> LabRecord:
    s = summary(run)
    by = {str(r["prompt_len"]): r for r in run["rows"]}
    held = s["tokens_equal"] and s["bytes_are_blocks_x_block_bytes"] and not s["leaked_blocks"]
    cuda = capabilities(backend).cuda  # a GPU count belongs to a CUDA run only
    return LabRecord(
        experiment_id="pd-split-real-handover",
        hypothesis="copying a request's KV blocks from a prefill engine into a decode engine's "
                   "pool continues the sequence with the same tokens, moves blocks x block "
                   "bytes, and adds the transfer to TTFT",
        environment={"backend": backend,
                     "gpus": params.gpus if cuda else None,
                     "placement": run["placement"],
                     "pd_and_colocated_share_a_device": run["shared"],
                     "command": f"workbench labs run pd-split --backend {backend}"
                                + (f" --param gpus={params.gpus}" if cuda else "")},
        model_io={"model": run["model"], "prompt_lens": [r["prompt_len"] for r in run["rows"]],
                  "max_tokens": params.real_max_tokens, "output_lengths": "exact (no EOS)"},
        cache_state="prefix caching off; every prompt computed once per engine",
        load={"arrival": "one request at a time (low load)"},
        samples={"requests": len(run["rows"]), "repeats": 1,
                 "order": "colocated first on even requests, PD first on odd ones"},
        outcomes={"tokens_equal": {k: r["tokens_equal"] for k, r in by.items()}},
        ttft={"colocated_ms": {k: r["colocated_ms"]["ttft"] for k, r in by.items()},
              "pd_ms": {k: r["pd_ms"]["ttft"] for k, r in by.items()}},
        tpot_itl={"first_decode_step_ms": {k: r["pd_ms"]["first_decode_step"]
                                           for k, r in by.items()}},
        e2e={"colocated_decode_ms": {k: r["colocated_ms"]["decode"] for k, r in by.items()},
             "pd_decode_ms": {k: r["pd_ms"]["decode"] for k, r in by.items()}},
        throughput={}, slo_goodput={"note": "not measured at low load (see the sim sweep)"},
        hits={"local": 0, "denominator": "prefix caching off"},
        transfer_bytes={"per_request": {k: r["transfer_bytes"] for k, r in by.items()},
                        "blocks": {k: r["blocks"] for k, r in by.items()},
                        "block_bytes": run["block_bytes"], "GBps": s["transfer_GBps"]},
        phase_times={"pd_split_ms": {k: r["pd_ms"] for k, r in by.items()}},
        kv={"leaked_blocks": run["leaked_blocks"]},
        correctness="greedy tokens equal to the colocated engine's" if s["tokens_equal"]
        else "greedy tokens differ from the colocated engine's",
        raw_data={}, verdict=("supported" if held else "not supported") +
        f": tokens equal {s['tokens_equal']}, {s['transfer_bytes']} bytes at "
        f"{s['transfer_GBps']} GB/s, PD TTFT +{s['extra_ttft_ms_median']} ms (median)",
        mechanism="the decode scheduler's KV connector allocates the destination blocks, the "
                  "prompt's blocks are copied and waited on, then the prefill side frees its own",
        open_questions=["both engines stepping at once (one thread per GPU)",
                        "layer-wise streaming of the copy", "PD under load on two GPUs"],
        applicability=run["placement"],
        manifest=Manifest.collect(
            hardware={"devices": run["devices"]},
            engine_config={"engine": "mini (vLLM-like scheduler)", "model": run["model"],
                           "block_size": 16, "dtype": "bf16"},
            kvcached_config={"kv": "VMM-backed pool per engine"}, backend=backend),
        results={"real": run, "summary": s})


def figures(run: dict[str, Any]) -> dict[str, Any]:
    """Per prompt: colocated TTFT beside PD's stacked prefill, decode wait and transfer."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    rows = run["rows"]
    x = [str(r["prompt_len"]) for r in rows]
    fig = go.Figure()
    fig.add_bar(x=x, y=[r["colocated_ms"]["ttft"] for r in rows], name="colocated TTFT",
                offsetgroup="colocated")
    base = [0.0] * len(rows)
    for key in ("prefill", "decode_wait", "transfer"):
        ys = [r["pd_ms"][key] for r in rows]
        fig.add_bar(x=x, y=ys, base=list(base), name=f"PD {key.replace('_', ' ')}",
                    offsetgroup="pd")
        base = [b + y for b, y in zip(base, ys, strict=True)]
    fig.update_layout(title="TTFT: colocated vs PD's split (ms)", xaxis_title="prompt tokens",
                      yaxis_title="ms", barmode="group")
    return {"ttft_split": fig}
