"""A saved real-vLLM colocation sweep (``records/*.json``, the lab's merged record) read back, not
re-run: which machine made it, its points, and the Markdown table and figure that set it beside
a simulated sweep (chapter 04); and a sweep's raw repeats read back (``read_sweep``, ``merged``:
an out_dir or a saved ``.repeats.json.gz``), for the lab's ``from_dir`` and the prediction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.engines import kinds
from workbench.errors import ConfigError
from workbench.labs.colocation.mini import MAX_REPEAT_BYTES, load_repeats
from workbench.strictjson import read_file

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
        if (isinstance(rec, dict) and _server(rec.get("environment", {}).get("engine"))
                and isinstance(rec.get("results", {}).get("points"), list) and _complete(rec)):
            rec["_path"] = p.name
            return rec
    return None


def _server(engine: object) -> bool:
    """Whether a record's engine names a server kind (a real engine's sweep)."""
    kind = kinds.REGISTRY.get(engine) if isinstance(engine, str) else None
    return kind is not None and kind.family == "server"


def saved_family(from_dir: str) -> str:
    """The engine family of the sweep ``from_dir`` (its first folder) holds: ``server`` for a
    real engine's repeats, else ``mini``."""
    return "server" if _server(read_sweep(from_dir.split(",")[0])[0].get("engine")) else "mini"


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


def _cell(sp: dict, unit: str = "") -> str:
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
        lines.append(f"| {peak} | {_cell(m['static'])} | {_cell(m['elastic'])} | "
                     f"{_cell(p['mean_speedup_spread'], 'x')} | {_cell(q['static'])} | "
                     f"{_cell(q['elastic'])} | {_cell(p['p99_speedup_spread'], 'x')} |")
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


def read_sweep(where: str | Path) -> list[dict]:
    """One sweep's repeats: a folder of ``repeat_<r>.json`` files, or a ``.json.gz`` holding
    their list (the raw data kept beside a saved record)."""
    p = Path(where)
    if not p.name.endswith(".json.gz"):
        return load_repeats(p)
    fix = "point from_dir at a sweep's out_dir or its saved .json.gz"
    data = read_file(p, "sweep file", fix, MAX_REPEAT_BYTES)
    if not (isinstance(data, list) and data and all(isinstance(r, dict) and "runs" in r
                                                   and "config" in r for r in data)):
        raise ConfigError(f"sweep file {p}", "is not a list of repeat records", fix)
    return data


def merged(folders: str) -> list[dict]:
    """The repeats of one or more sweeps (``a,b``: folders or saved ``.json.gz``): a repeat in
    several is taken from the one with more points (a repeat cut short in one call, rerun in
    the next)."""
    best: dict[int, dict] = {}
    for folder in [f for f in folders.split(",") if f]:
        for rep in read_sweep(folder):
            r = int(rep["repeat"])
            if r not in best or len(rep["runs"]) > len(best[r]["runs"]):
                best[r] = rep
    return [best[r] for r in sorted(best)]
