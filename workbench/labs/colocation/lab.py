"""The colocation lab (co-located instances under kvcached's staggered ramp, a static KV split
vs one elastic KV budget: docs/sources.md#upstream-kvcached-colocation): the Lab, its runners
table and the checks before anything runs; the report every family's run becomes; a saved
real-vLLM sweep's record read back (chapter 04).

The runners (:mod:`.sim`, :mod:`.mini`, :mod:`.server`) each hand back a
:class:`~workbench.labs.colocation.params.ColocationRun`; the points, record, Markdown and
figures below are built from it the same way for every family:

* ``sim``: three simulated vLLM-like Llama-3.1-8B instances on one A100-80G (SimPy),
  kvcached's own PEAK values;
* ``gpu``: three mini engines on one CUDA GPU (:mod:`workbench.mini.colocation`), or three real
  vLLM servers (``engine=vllm``), the ramp time-compressed to a few minutes; ``host`` runs that
  same code on the CPU (a smoke run).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from workbench.backends import capabilities
from workbench.errors import ConfigError
from workbench.labs.colocation.params import (
    MODES,
    PAIR,
    ColocationParams,
    ColocationRun,
    reading_sweep,
    saved_family,
    server_kind,
    spread,
    sweep_modes,
)
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.kvcached import KVCACHED
from workbench.labs.kit.record import LabRecord
from workbench.labs.kit.resolve import LabRun
from workbench.outfiles import Outputs
from workbench.strictjson import read_file


def _result(params: ColocationParams, run: ColocationRun) -> LabResult:
    """The one hand-off to the report; records read back from files (from_dir) are outside
    input, so a bad field there is one line."""
    with reading_sweep(f"from_dir={params.from_dir!r}") if params.from_dir else nullcontext():
        points = make_points(run)
        return LabResult(build_record(run, points), markdown(run, points),
                         tables={"points": points}, figures=figures(points))


def run_sim(params: ColocationParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    from workbench.labs.colocation.sim import run_sim as sweep

    return _result(params, sweep(params, progress))


def run_mini(params: ColocationParams, run: LabRun,
             progress: Progress | None = None) -> LabResult:
    """Mini engines on real memory; a vLLM sweep's saved repeats (from_dir) are read by the
    server runner's reader."""
    from workbench.labs.colocation.mini import run_mini as sweep

    if params.from_dir and saved_family(params.from_dir) == "server":
        return run_server(params, run, progress)
    return _result(params, sweep(params, run.backend, progress))


def run_server(params: ColocationParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    from workbench.labs.colocation.server_run import run_server as sweep

    return _result(params, sweep(params, run.backend, progress))


class ColocationLab(Lab):
    name = "colocation"
    description = ("3 x Llama-3.1-8B on one GPU under staggered ramp peaks: static KV split vs "
                   "elastic KV; mean/p99 TTFT and speedups (sim: next to kvcached's table)")
    params_type = ColocationParams
    runners = {"simulated": run_sim, "mini": run_mini, "server": run_server}
    reads_back = "from_dir"  # saved repeats: read back, no engine started

    def check_run(self, params: ColocationParams, run: LabRun) -> None:
        """Before anything runs: the repeats' numbering, and the folder a sweep writes its
        ``repeat_<r>.json`` files to (``out_dir``), checked as every output is
        (:class:`workbench.outfiles.Outputs`; a run reading saved repeats back writes none)."""
        if not 1 <= params.repeats <= 100 or params.first_repeat < 0:
            raise ConfigError(f"repeats={params.repeats}, first_repeat={params.first_repeat}",
                              "a sweep runs 1 to 100 repeats, numbered from 0 or more",
                              "use e.g. repeats=3, first_repeat=0")
        if params.out_dir and not params.from_dir:
            first = params.first_repeat
            Outputs().folder(params.out_dir, [f"repeat_{r}.json" for r in
                                              range(first, first + params.repeats)], "out_dir")
        if not params.from_dir:
            check_modes(params, run)


def check_modes(params: ColocationParams, run: LabRun) -> None:
    """Before anything starts: kvcached's setting and its mode exist on real vLLM only, the
    report pairs every mode with static and elastic, and the kvcached mode needs an interpreter
    that sees kvcached (:func:`workbench.engines.real.kvcached.kvcached_python`) and CUDA."""
    modes, fields = sweep_modes(params), ColocationParams.__dataclass_fields__
    wanted = f"setting={params.setting}, modes={','.join(modes)}"
    if run.family != "server" and (params.setting != "compressed" or params.modes):
        raise ConfigError(wanted, "are the real-vLLM sweep's choices",
                          "add --param engine=vllm (backend gpu or host), or drop them")
    if len(set(modes)) != len(modes) or not set(PAIR) <= set(modes):
        raise ConfigError(f"modes={','.join(modes)}", "the report sets every mode beside static "
                          "and elastic, each once", "use static,elastic or static,elastic,kvcached")
    if params.setting == "kvcached" and any(getattr(params, k) != fields[k].default
                                            for k in ("time_scale", "budget_gib")):
        raise ConfigError(wanted, "fixes the time scale (1) and the KV total (the one kvcached's "
                          "A100-80G run left)", "leave time_scale and budget_gib unset")
    if "kvcached" in modes:
        if params.together:
            raise ConfigError(wanted, "starts kvcached's engines alone (its cap reads the "
                              "device's free memory)", "leave together unset")
        from workbench.engines.real.kvcached import kvcached_python

        kvcached_python()
        if not run.caps.cuda:
            raise ConfigError(wanted, "kvcached maps CUDA memory", "run on backend gpu")


# -- the report ----------------------------------------------------------------------------------

def _ms(x: float) -> float:
    return round(x * 1e3, 1)


def _ttft(runs: list[dict], stat: str) -> dict[str, float]:
    return {k: _ms(x) for k, x in spread([r["ttft"][stat] for r in runs]).items()}


def _ratio(pt: dict, key: str, num: list[dict], den: list[dict], stat: str) -> None:
    """``pt[key]``: ``num`` / ``den`` TTFT of the same repeat, median over repeats, and its
    range (``key_spread``)."""
    sp = spread([a["ttft"][stat] / b["ttft"][stat] for a, b in zip(num, den, strict=False)])
    pt[key] = round(sp["median"], 2)
    pt[f"{key}_spread"] = {k: round(v, 2) for k, v in sp.items()}


def make_points(run: ColocationRun) -> list[dict]:
    """One point per PEAK: medians over repeats (the plain keys) and their range (``*_spread``);
    a speedup is static / elastic of the same repeat, then its median and range. Where kvcached
    0.1.6 ran as a third mode: its TTFT beside them, static / kvcached (``*_speedup_kvcached``)
    and kvcached / workbench elastic (``*_elastic_vs_kvcached``: above 1, elastic is faster)."""
    points = []
    for p in run.peaks:
        if (p, "static") not in run.overall or (p, "elastic") not in run.overall:
            continue
        by = {m: run.overall[(p, m)] for m in MODES if (p, m) in run.overall}
        s, e = by["static"], by["elastic"]
        n = min(len(s), len(e))
        pt: dict[str, Any] = {"peak": p, "repeats": n}
        if run.time_scale is not None:
            pt["effective_peak_rps"] = p * run.time_scale
        for stat in ("mean", "p50", "p99"):
            sp = {m: _ttft(runs, stat) for m, runs in by.items()}
            pt[f"{stat}_ttft_ms"] = {m: sp[m]["median"] for m in by}
            pt[f"{stat}_ttft_spread_ms"] = sp
        for stat in ("mean", "p99"):
            _ratio(pt, f"{stat}_speedup", s, e, stat)
            if "kvcached" in by:
                _ratio(pt, f"{stat}_speedup_kvcached", s, by["kvcached"], stat)
                _ratio(pt, f"{stat}_elastic_vs_kvcached", by["kvcached"], e, stat)
        pt["tpot_ms"] = {m: _ms(spread([r["tpot"]["mean"] for r in runs])["median"])
                         for m, runs in by.items()}
        pt["preemptions"] = {m: spread([r["preemptions"] for r in runs])["median"]
                             for m, runs in by.items()}
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

    third = any("kvcached" in r["mean_ttft_ms"] for r in points)
    if third:
        lines += ["kvcached 0.1.6 ran as a third mode: its TTFT, static / kvcached ('its "
                  "speedup') and kvcached / workbench elastic ('elastic vs it': above 1x, the "
                  "workbench's pool is faster).", ""]
    for title, stat in (("Mean TTFT", "mean"), ("P99 TTFT", "p99")):
        head = "| PEAK | ours static | ours elastic | ours speedup |"
        if third:
            head += " kvcached 0.1.6 | its speedup | elastic vs it |"
        lines += [f"## {title}", "", head + (" kvcached static | kvcached elastic | kvcached "
                                             "speedup |" if ref else ""),
                  "|---|---|---|---|" + ("---|---|---|" if third else "")
                  + ("---|---|---|" if ref else "")]
        for r in points:
            sp = r[f"{stat}_ttft_spread_ms"]
            row = (f"| {peak(r)} | {_cell(sp['static'])} | {_cell(sp['elastic'])} | "
                   f"{_cell(r[f'{stat}_speedup_spread'], str, 'x')} |")
            if third:
                row += _third_cells(r, stat)
            if ref:
                k = r["kvcached"]
                row += (f" {_fmt(k[f'{stat}_static'])} | {_fmt(k[f'{stat}_elastic'])} | "
                        f"{k[f'{stat}_speedup']}x |")
            lines.append(row)
        lines.append("")
    shown = [m for m in MODES if any(m in r["tpot_ms"] for r in points)] or list(PAIR)
    names = " / ".join(shown)
    lines += ["## Other columns", "",
              f"| PEAK | TPOT {names} (ms, median) | preemptions {names} (median) |",
              "|---|---|---|"]
    for r in points:
        lines.append(f"| {peak(r)} | {_each(r['tpot_ms'], shown)} | "
                     f"{_each(r['preemptions'], shown)} |")
    if third:
        lines += ["", _elastic_vs_kvcached(points)]
    return "\n".join(lines + ["", *run.footer]) + "\n"


def _each(values: dict, modes: list[str]) -> str:
    return " / ".join("-" if values.get(m) is None else f"{values[m]}" for m in modes)


def _third_cells(r: dict, stat: str) -> str:
    """kvcached 0.1.6's cells of one row: its TTFT and its two ratios ('-' where it did not
    run at that PEAK)."""
    sp = r[f"{stat}_ttft_spread_ms"].get("kvcached")
    if sp is None:
        return " - | - | - |"
    return (f" {_cell(sp)} | {_cell(r[f'{stat}_speedup_kvcached_spread'], str, 'x')} | "
            f"{_cell(r[f'{stat}_elastic_vs_kvcached_spread'], str, 'x')} |")


def kvcached_faster(r: dict) -> list[str]:
    """The TTFT statistics (mean, p99) at which kvcached 0.1.6 beat the workbench's elastic
    pool at point ``r`` beyond the spread (its slowest repeat faster than elastic's fastest)."""
    out = []
    for stat in ("mean", "p99"):
        sp = r[f"{stat}_ttft_spread_ms"]
        if "kvcached" in sp and sp["kvcached"]["max"] < sp["elastic"]["min"]:
            out.append(stat)
    return out


def _elastic_vs_kvcached(points: list[dict]) -> str:
    ran = [r for r in points if "kvcached" in r["mean_ttft_ms"]]
    lost = [f"PEAK {r['peak']} ({', '.join(k)})" for r in ran if (k := kvcached_faster(r))]
    verdict = ("met" if not lost and len(ran) == len(points) else "missed")
    where = f"; kvcached faster beyond the spread at {'; '.join(lost)}" if lost else ""
    gaps = "" if len(ran) == len(points) else f"; kvcached ran at {len(ran)} of {len(points)} PEAKs"
    return (f"Workbench elastic at least as fast as kvcached 0.1.6 at every PEAK (mean and p99, "
            f"beyond the spread): {verdict}{where}{gaps}.")


def figures(points: list[dict]) -> dict[str, Any]:
    """Mean and p99 TTFT per PEAK of every mode run at each PEAK: medians, bars to the min and
    max over repeats (plotly; {} when it is not installed)."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    fig = go.Figure()
    for stat in ("mean", "p99"):
        for m in [m for m in MODES if points and all(m in p["mean_ttft_ms"] for p in points)]:
            sp = [p[f"{stat}_ttft_spread_ms"][m] for p in points]
            fig.add_scatter(x=[p["peak"] for p in points], y=[s["median"] for s in sp],
                            name=f"{stat} {m}",
                            error_y={"type": "data", "symmetric": False,
                                     "array": [s["max"] - s["median"] for s in sp],
                                     "arrayminus": [s["median"] - s["min"] for s in sp]})
    fig.update_layout(xaxis_title="PEAK (req/s)", yaxis_title="TTFT (ms), median [min-max]",
                      yaxis_type="log")
    return {"ttft": fig}


# -- a saved real sweep's record (chapter 04) -----------------------------------------------------

RECORDS = Path(__file__).resolve().parent / "records"
MAX_BYTES = 8 << 20  # a merged record is well under 2 MB


def saved_record(folder: str | Path = RECORDS) -> dict | None:
    """The newest complete real-vLLM sweep record in ``folder`` (by name), None when there is
    none or it is not one (a regular JSON file with ``results.points`` and engine ``vllm``).
    Complete: every point kept all the sweep's repeats (a sweep cut short by its deadline is a
    held-out record for the simulator, not the chapter's table)."""
    folder = Path(folder)
    for p in sorted(folder.glob("*.json"), reverse=True) if folder.is_dir() else []:
        try:
            rec = read_file(p, "record", "", MAX_BYTES)
        except ConfigError:
            continue
        if (isinstance(rec, dict) and server_kind(rec.get("environment", {}).get("engine"))
                and isinstance(rec.get("results", {}).get("points"), list) and _complete(rec)):
            rec["_path"] = p.name
            return rec
    return None


def _complete(rec: dict) -> bool:
    want = (rec.get("samples") or {}).get("runs_per_point")
    return all(isinstance(p, dict) and p.get("repeats") == want for p in rec["results"]["points"])


def machine(rec: dict) -> str:
    """Who made the record: the device, vLLM's version, the date, the command."""
    prov = rec.get("results", {}).get("provenance") or {}
    env = rec.get("environment", {})
    dev = rec.get("results", {}).get("device") or "?"
    return (f"{dev}, vLLM {env.get('vllm_version') or '?'}, {prov.get('date', '?')}: "
            f"`{prov.get('command') or env.get('command', '?')}`")


def _span(sp: dict, unit: str = "") -> str:
    return f"{sp['median']:,.4g}{unit} [{sp['min']:,.4g}-{sp['max']:,.4g}]"


def table(points: list[dict], scaled: bool) -> str:
    """One row per PEAK: mean and p99 TTFT (ms) static / elastic and the speedups, each the
    median [min-max] over repeats."""
    lines = ["| PEAK | mean TTFT static | mean TTFT elastic | mean speedup | p99 TTFT static | "
             "p99 TTFT elastic | p99 speedup |", "|---|---|---|---|---|---|---|"]
    for p in points:
        peak = f"{p['peak']} ({p['effective_peak_rps']:g})" if scaled and \
            "effective_peak_rps" in p else str(p["peak"])
        m, q = p["mean_ttft_spread_ms"], p["p99_ttft_spread_ms"]
        lines.append(f"| {peak} | {_span(m['static'])} | {_span(m['elastic'])} | "
                     f"{_span(p['mean_speedup_spread'], 'x')} | {_span(q['static'])} | "
                     f"{_span(q['elastic'])} | {_span(p['p99_speedup_spread'], 'x')} |")
    return "\n".join(lines)


def beside(real: list[dict], sim: list[dict]) -> Any:
    """Mean and p99 TTFT speedup per PEAK, the simulated sweep left, the real one right (their
    PEAKs are not the same axis: the real ramp is time-compressed); None without plotly."""
    try:
        from plotly.subplots import make_subplots
    except ImportError:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("simulated (A100-80G model)",
                                                        "real vLLM (saved record)"))
    for col, pts in ((1, sim), (2, real)):
        for stat, dash in (("mean", "solid"), ("p99", "dot")):
            sp = [p[f"{stat}_speedup_spread"] for p in pts]
            fig.add_scatter(x=[p["peak"] for p in pts], y=[s["median"] for s in sp],
                            name=f"{stat} speedup ({'sim' if col == 1 else 'real'})",
                            line={"dash": dash}, row=1, col=col,
                            error_y={"type": "data", "symmetric": False,
                                     "array": [s["max"] - s["median"] for s in sp],
                                     "arrayminus": [s["median"] - s["min"] for s in sp]})
    fig.update_yaxes(type="log", title_text="static / elastic TTFT")
    fig.update_xaxes(title_text="PEAK")
    return fig
