"""Figures and tables shared by the phase labs: a memory timeline with the phases shaded, and
per-phase latency rows (plotly is optional: without it the figures are ``{}``)."""

from __future__ import annotations

from typing import Any

from workbench.labs.kit.phased_sim import window_slice
from workbench.labs.kit.report import ms_or_none as _ms
from workbench.units import GiB
from workbench.viz.style import LIMIT
from workbench.viz.style import WINDOW_SHADES as SHADES  # the one colour scheme


def phase_rows(run: dict[str, Any], label: str) -> list[dict[str, Any]]:
    """One row per (instance, phase): traffic, latency percentiles and the page counts."""
    rows = []
    ppb = run["page_id_bytes"]
    for inst in run["instances"]:
        tl = run["timeline"][inst["name"]]
        for w in run["windows"][inst["name"]]:
            s = window_slice(tl, w["start"], w["end"])
            if not s["t"]:
                continue
            m = inst["by_phase"].get(w["name"])
            row: dict[str, Any] = {
                "variant": label, "instance": inst["name"], "phase": w["name"],
                "start_s": w["start"], "end_s": w["end"], "requests": w["requests"],
                "peak_mapped_gib": round(max(s["mapped_bytes"]) / GiB, 3),
                "end_mapped_gib": round(s["mapped_bytes"][-1] / GiB, 3),
                "peak_in_use_pages": max(s["in_use_pages"]),
                "end_in_use_pages": s["in_use_pages"][-1],
                "reserved_min": min(s["reserved_pages"]), "reserved_max": max(s["reserved_pages"]),
                "end_reserved_pages": s["reserved_pages"][-1],
                "end_used_blocks": s["used_blocks"][-1],
                "end_cached_blocks": s["cached_blocks"][-1],
                "page_id_mib": ppb >> 20}
            if m:
                row.update({
                    "ttft_p50_ms": _ms(m["ttft"]["p50"]), "ttft_p95_ms": _ms(m["ttft"]["p95"]),
                    "ttft_p99_ms": _ms(m["ttft"]["p99"]), "tpot_p50_ms": _ms(m["tpot"]["p50"]),
                    "itl_p99_ms": _ms(m["itl"]["p99"]), "e2e_p50_ms": _ms(m["e2e"]["p50"]),
                    "e2e_p99_ms": _ms(m["e2e"]["p99"]), "finished": m["finished"],
                    "preemptions": m["preemptions"], "hit_tokens": m["prefix_hit_tokens"],
                    "prompt_tokens": m["prompt_tokens"]})
            rows.append(row)
    return rows


def timeline_figure(run: dict[str, Any], title: str, *, stacked: bool = False) -> Any:
    """Mapped / in-use / reserved GiB of every instance over time, the first instance's phases
    shaded (a shutdown is a dashed line). ``stacked``: the instances' mapped bytes stacked, with
    the KV budget as a line, so memory moving between them shows as one area giving way."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return None
    fig = go.Figure()
    ppb = run["page_id_bytes"]
    for name, tl in run["timeline"].items():
        t = tl["t"]
        if stacked:
            fig.add_scatter(x=t, y=[b / GiB for b in tl["mapped_bytes"]], name=f"{name} mapped",
                            stackgroup="mapped", mode="lines")
            continue
        fig.add_scatter(x=t, y=[b / GiB for b in tl["mapped_bytes"]], name=f"{name} mapped",
                        mode="lines")
        fig.add_scatter(x=t, y=[p * ppb / GiB for p in tl["in_use_pages"]],
                        name=f"{name} in use", mode="lines", line={"dash": "dot"})
        fig.add_scatter(x=t, y=[p * ppb / GiB for p in tl["reserved_pages"]],
                        name=f"{name} reserve", mode="lines", line={"dash": "dash"})
    if stacked and run.get("kv_budget_bytes"):
        fig.add_hline(y=run["kv_budget_bytes"] / GiB, line_dash="dash", line_color=LIMIT,
                      annotation_text="KV budget")
    first = next(iter(run["windows"].values()))
    for i, w in enumerate(first):
        fig.add_vrect(x0=w["start"], x1=w["end"], fillcolor=SHADES[i % len(SHADES)],
                      line_width=0, annotation_text=w["name"], annotation_position="top left")
    for name, t in run.get("shutdowns", {}).items():
        fig.add_vline(x=t, line_dash="dash", annotation_text=f"{name} exits")
    fig.update_layout(title=title, xaxis_title="simulated time (s)", yaxis_title="GiB",
                      legend={"orientation": "h"})
    return fig


def latency_lines(runs: dict[str, list[dict[str, Any]]], title: str) -> list[str]:
    """Markdown: per (label, instance, phase with requests), TTFT / TPOT / E2E percentiles over
    the requests of every run under that label (the seeds pooled), and the spread of the
    per-run p99 TTFT and ITL (seed 003 §2: distributions, repeats)."""
    from workbench.engines.metrics import Dist

    def ms(x: float) -> str:
        return "-" if x != x else f"{x * 1e3:,.0f}"

    out = ["", f"## {title}", "",
           "| run | instance | phase | n | TTFT p50 / p95 / p99 ms | TPOT p50 / p99 ms | E2E p50 "
           "/ p99 ms | per seed: TTFT p99, ITL p99 ms (min..max) |",
           "|---|---|---|---|---|---|---|---|"]
    for label, rs in runs.items():
        for k, inst in enumerate(rs[0]["instances"]):
            for phase in inst["by_phase"]:
                reqs = [q for r in rs for q in r["instances"][k]["requests"] if q["group"] == phase]
                d = {m: Dist.of([q[m] for q in reqs if q[m] is not None])
                     for m in ("ttft", "tpot", "e2e")}
                per = [r["instances"][k]["by_phase"][phase] for r in rs]
                t99, i99 = ([x[m]["p99"] for x in per] for m in ("ttft", "itl"))
                out.append(f"| {label} | {inst['name']} | {phase} | {d['ttft'].n} | "
                           f"{ms(d['ttft'].p50)} / {ms(d['ttft'].p95)} / {ms(d['ttft'].p99)} | "
                           f"{ms(d['tpot'].p50)} / {ms(d['tpot'].p99)} | {ms(d['e2e'].p50)} / "
                           f"{ms(d['e2e'].p99)} | {ms(min(t99))}..{ms(max(t99))}, "
                           f"{ms(min(i99))}..{ms(max(i99))} |")
    return out
