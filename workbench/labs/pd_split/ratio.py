"""pd-split's P:D ratio step (seed 003 E7 step 5): at a fixed GPU count, every split of prefill
and decode instances against colocated serving on all of them, at one rate and two long-prompt
shares; both sides' busy share shows which one saturates first."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from workbench.errors import ConfigError
from workbench.labs.chunked_prefill.sim import mix
from workbench.labs.kit.report import P50_P99, lat_cell
from workbench.pd.cluster import PDConfig, run_colocated, run_pd

SHARES = (0.1, 0.5)


def ratio_sweep(base: PDConfig, gpus: int, rate: float, n: int, seed: int) -> list[dict]:
    from workbench.labs.pd_split.sim import _row  # the same row as the main sweep

    if gpus < 2:
        raise ConfigError(f"ratio_gpus={gpus}", "leaves no room for both sides",
                          "use at least 2 GPUs (0 skips the ratio step)")
    rows = []
    for share in SHARES:
        colo = run_colocated(replace(base, prefill=gpus - 1, decode=1), mix(rate, n, share, seed))
        rows.append({"long_share": share, "split": f"colocated x{gpus}", "prefill": 0,
                     **_row("colocated", colo)})
        for p in range(1, gpus):
            res = run_pd(replace(base, prefill=p, decode=gpus - p), mix(rate, n, share, seed))
            rows.append({"long_share": share, "split": f"{p}:{gpus - p}", "prefill": p,
                         **_row("pd", res)})
    return rows


def best_splits(rows: list[dict]) -> dict[str, dict[str, str]]:
    """Per share, the split with the highest goodput under each SLO."""
    out: dict[str, dict[str, str]] = {}
    for share in sorted({r["long_share"] for r in rows}):
        sel = [r for r in rows if r["long_share"] == share]
        out[f"{share:g}"] = {k: max(sel, key=lambda r: r[f"goodput_{k}"])["split"]
                             for k in ("interactive", "streaming")}
    return out


def ratio_markdown(rows: list[dict], gpus: int, rate: float) -> list[str]:
    if not rows:
        return []
    best = best_splits(rows)
    md = ["", f"## P:D ratio on {gpus} GPUs at {rate:g} req/s (seed step 5)", "",
          "| long share | split | TTFT p50 / p99 | TPOT p99 | goodput interactive | goodput "
          "streaming | busy |", "|" + "---|" * 7]
    for r in rows:
        busy = ", ".join(f"{k} {x:.0%}" for k, x in r["busy"].items())
        md.append(f"| {r['long_share']:g} | {r['split']} | {lat_cell(r['ttft_ms'], P50_P99)} | "
                  f"{r['tpot_ms']['p99']:,.1f} | "
                  f"{r['goodput_interactive']:g} | {r['goodput_streaming']:g} | {busy} |")
    md += [""] + [f"* long share {s}: best split for the interactive SLO **{b['interactive']}**, "
                  f"for the streaming SLO **{b['streaming']}**." for s, b in best.items()]
    md += ["", "A split starved of prefill instances queues prompts (TTFT, the prefill side's "
           "busy share climbs); one starved of decode instances batches more decodes per step "
           "(TPOT). The best split moves with the mix: the ratio must follow the load."]
    return md


def ratio_figure(rows: list[dict]) -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError:
        return None
    fig = go.Figure()
    for share in SHARES:
        sel = [r for r in rows if r["long_share"] == share]
        fig.add_bar(x=[r["split"] for r in sel], y=[r["goodput_streaming"] for r in sel],
                    name=f"streaming, share {share:g}")
        fig.add_bar(x=[r["split"] for r in sel], y=[r["goodput_interactive"] for r in sel],
                    name=f"interactive, share {share:g}")
    fig.update_layout(barmode="group", title="goodput by P:D split (req/s)",
                      yaxis_title="goodput (req/s)")
    return fig
