"""The colocation lab's points, record, Markdown and figures, the same for every backend:
co-located instances under kvcached's staggered ramp, a static KV split vs one elastic KV
budget (docs/sources.md#upstream-kvcached-colocation).

* ``sim``: three simulated vLLM-like Llama-3.1-8B instances on one A100-80G (SimPy,
  :mod:`workbench.labs.colocation.sim`), kvcached's own PEAK values;
* ``gpu``: three mini engines on one CUDA GPU (:mod:`workbench.mini.colocation`), the ramp
  time-compressed to a few minutes; ``host`` runs that same code on the CPU (a smoke run).

Both produce the overall summary of every (PEAK, mode) run; the points, the record and the
Markdown below are built from them the same way.
"""

from __future__ import annotations

import math
from typing import Any

from workbench.backends import capabilities
from workbench.labs.colocation.rows import MODES, ColocationRun, spread
from workbench.labs.kit.kvcached import KVCACHED
from workbench.labs.kit.record import LabRecord


def _ms(x: float) -> float:
    return round(x * 1e3, 1)


def _ttft(runs: list[dict], stat: str) -> dict[str, float]:
    return {k: _ms(x) for k, x in spread([r["ttft"][stat] for r in runs]).items()}


def make_points(run: ColocationRun) -> list[dict]:
    """One point per PEAK: medians over repeats (the plain keys) and their range (``*_spread``);
    a speedup is static / elastic of the same repeat, then its median and range."""
    points = []
    for p in run.peaks:
        if (p, "static") not in run.overall or (p, "elastic") not in run.overall:
            continue
        s, e = run.overall[(p, "static")], run.overall[(p, "elastic")]
        n = min(len(s), len(e))
        pt: dict[str, Any] = {"peak": p, "repeats": n}
        if run.time_scale is not None:
            pt["effective_peak_rps"] = p * run.time_scale
        for stat in ("mean", "p50", "p99"):
            sp = {"static": _ttft(s, stat), "elastic": _ttft(e, stat)}
            pt[f"{stat}_ttft_ms"] = {m: sp[m]["median"] for m in MODES}
            pt[f"{stat}_ttft_spread_ms"] = sp
        for stat in ("mean", "p99"):
            sp = spread([s[i]["ttft"][stat] / e[i]["ttft"][stat] for i in range(n)])
            pt[f"{stat}_speedup"] = round(sp["median"], 2)
            pt[f"{stat}_speedup_spread"] = {k: round(v, 2) for k, v in sp.items()}
        pt["tpot_ms"] = {m: _ms(spread([r["tpot"]["mean"] for r in runs])["median"])
                         for m, runs in (("static", s), ("elastic", e))}
        pt["preemptions"] = {m: spread([r["preemptions"] for r in runs])["median"]
                             for m, runs in (("static", s), ("elastic", e))}
        if run.time_scale is None:
            pt["kvcached"] = {k: KVCACHED[k].get(p) for k in KVCACHED}
        points.append(pt)
    return points


def agrees(ours: float, theirs: float) -> bool:
    """One speedup agrees with kvcached's: both near 1x (under 1.25x), or within 2x of it."""
    return (ours < 1.25 and theirs < 1.25) or 0.5 <= ours / theirs <= 2.0


def _shape_departs(points: list[dict]) -> dict | None:
    """The first PEAK whose mean or p99 speedup departs from kvcached's (None: all agree)."""
    for pt in points:
        ref = pt.get("kvcached") or {}
        if ref.get("mean_speedup") is None:
            continue
        if not (agrees(pt["mean_speedup"], ref["mean_speedup"])
                and agrees(pt["p99_speedup"], ref["p99_speedup"])):
            return pt
    return None


def _verdict(run: ColocationRun, points: list[dict]) -> str:
    """Where kvcached's figures are beside the run (simulated PEAKs): supported only when every
    such PEAK agrees with its shape (:func:`agrees`, mean and p99). Elsewhere (a real GPU, time
    scaled): supported when some PEAK's median mean-TTFT speedup reaches 2x (the low end of
    kvcached's 2-28x) and the lowest PEAK costs elastic at most 10%."""
    if not points:
        return "no complete PEAK point"
    best_mean = max(points, key=lambda r: r["mean_speedup"])
    best_p99 = max(points, key=lambda r: r["p99_speedup"])
    low = points[0]
    where = "in simulation" if capabilities(run.backend).simulated else f"on {run.backend}"
    med = " (medians over repeats)" if low.get("repeats", 1) > 1 else ""
    gains = (f"mean TTFT speedup up to {best_mean['mean_speedup']}x (PEAK {best_mean['peak']}), "
             f"p99 up to {best_p99['p99_speedup']}x (PEAK {best_p99['peak']})")
    if any((pt.get("kvcached") or {}).get("mean_speedup") is not None for pt in points):
        off = _shape_departs(points)
        if off is None:
            return f"Supported (shape) {where}: every PEAK agrees with kvcached's; {gains}{med}."
        ref = off["kvcached"]
        return (f"Not supported {where}: the shape departs from kvcached's at PEAK {off['peak']} "
                f"(mean {off['mean_speedup']}x vs {ref['mean_speedup']}x, p99 "
                f"{off['p99_speedup']}x vs {ref['p99_speedup']}x); {gains}{med}.")
    ok = best_mean["mean_speedup"] >= 2.0 and low["mean_speedup"] >= 0.9
    return (f"{'Supported' if ok else 'Not supported'} {where}: {gains}; at PEAK {low['peak']} "
            f"{low['mean_speedup']}x{med}.")


def build_record(run: ColocationRun, points: list[dict]) -> LabRecord:
    modes = [m for m in MODES if any((p, m) in run.overall for p in run.peaks)]

    def dist(mode: str, key: str) -> dict:  # per PEAK: one value per repeat
        return {str(p): [r[key] for r in run.overall[(p, mode)]] for p in run.peaks
                if (p, mode) in run.overall}

    rec = dict(run.record)
    return LabRecord(
        hypothesis="Sharing KV memory elastically between co-located instances lowers TTFT "
                   "when one instance peaks while the others idle, at a small cost at low load.",
        outcomes={m: {"finished": dist(m, "finished"), "requests": dist(m, "requests"),
                      "rejected": sum(sum(v) for v in dist(m, "rejected").values())}
                  for m in modes},
        ttft={m: dist(m, "ttft") for m in modes},
        tpot_itl={f"{k}_{m}": dist(m, k) for k in ("tpot", "itl") for m in modes},
        e2e={m: dist(m, "e2e") for m in modes},
        throughput={m: {str(p): [{k: r[k] for k in ("req_per_s", "input_tok_per_s",
                                                     "output_tok_per_s")}
                                 for r in run.overall[(p, m)]]
                        for p in run.peaks if (p, m) in run.overall} for m in modes},
        slo_goodput={"slo": run.slo,
                     "goodput_req_per_s": {m: dist(m, "goodput_req_per_s") for m in modes},
                     "slo_attainment": {m: dist(m, "slo_attainment") for m in modes}},
        hits={"local": 0, "external": None, "denominator": "prefix caching off"},
        transfer_bytes=None, phase_times=None, verdict=_verdict(run, points),
        mechanism="A static split caps each instance's in-flight KV; at its peak an instance "
                  "preempts (recompute) and queues, so TTFT explodes. Elastic pools let the "
                  "peaking instance map the pages the idle ones do not use.",
        results={"points": points, **run.results}, **rec)


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.0f}" if isinstance(x, (int, float)) and abs(x) >= 10 else f"{x}"


def _cell(sp: dict, fmt=_fmt, unit: str = "") -> str:
    """``median [min-max]``; the median alone when the range is one value (one repeat)."""
    if sp["min"] == sp["max"]:
        return f"{fmt(sp['median'])}{unit}"
    return f"{fmt(sp['median'])}{unit} [{fmt(sp['min'])}-{fmt(sp['max'])}]"


def markdown(run: ColocationRun, points: list[dict]) -> str:
    ref = run.time_scale is None  # kvcached's columns only where the PEAKs are its own
    lines = [f"# {run.title}", "", *run.setup]
    n = max((r["repeats"] for r in points), default=1)
    if n > 1:
        lines += [f"Each cell: median over {n} repeats [min-max]; a speedup is static / elastic "
                  "of the same repeat.", ""]

    def peak(r: dict) -> str:
        return str(r["peak"]) if ref else f"{r['peak']} ({r['effective_peak_rps']:g})"

    for title, stat in (("Mean TTFT", "mean"), ("P99 TTFT", "p99")):
        head = "| PEAK | ours static | ours elastic | ours speedup |"
        lines += [f"## {title}", "", head + (" kvcached static | kvcached elastic | kvcached "
                                             "speedup |" if ref else ""),
                  "|---|---|---|---|" + ("---|---|---|" if ref else "")]
        for r in points:
            sp = r[f"{stat}_ttft_spread_ms"]
            row = (f"| {peak(r)} | {_cell(sp['static'])} | {_cell(sp['elastic'])} | "
                   f"{_cell(r[f'{stat}_speedup_spread'], str, 'x')} |")
            if ref:
                k = r["kvcached"]
                row += (f" {_fmt(k[f'{stat}_static'])} | {_fmt(k[f'{stat}_elastic'])} | "
                        f"{k[f'{stat}_speedup']}x |")
            lines.append(row)
        lines.append("")
    lines += ["## Other columns", "",
              "| PEAK | TPOT static / elastic (ms, median) | preemptions static / elastic "
              "(median) |", "|---|---|---|"]
    for r in points:
        lines.append(f"| {peak(r)} | {r['tpot_ms']['static']} / {r['tpot_ms']['elastic']} | "
                     f"{r['preemptions']['static']} / {r['preemptions']['elastic']} |")
    return "\n".join(lines + ["", *run.footer]) + "\n"


def figures(points: list[dict]) -> dict[str, Any]:
    """Mean and p99 TTFT per PEAK, static vs elastic: medians, bars to the min and max over
    repeats (plotly; {} when it is not installed)."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    fig = go.Figure()
    for stat in ("mean", "p99"):
        for m in MODES:
            sp = [p[f"{stat}_ttft_spread_ms"][m] for p in points]
            fig.add_scatter(x=[p["peak"] for p in points], y=[s["median"] for s in sp],
                            name=f"{stat} {m}",
                            error_y={"type": "data", "symmetric": False,
                                     "array": [s["max"] - s["median"] for s in sp],
                                     "arrayminus": [s["median"] - s["min"] for s in sp]})
    fig.update_layout(xaxis_title="PEAK (req/s)", yaxis_title="TTFT (ms), median [min-max]",
                      yaxis_type="log")
    return {"ttft": fig}


