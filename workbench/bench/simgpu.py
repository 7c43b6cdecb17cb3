"""The simulator beside the GPU: the colocation sweep's workload on ``sim`` (H200 preset: VMM
charged per call with the H200's measured latencies, the step time fitted on the sweep's own
measured steps, the background mapper as the pool's preallocation process) and a side-by-side
table of TTFT p50 and p99 per (PEAK, mode) against the GPU's median over repeats.

The table's arithmetic (:func:`side_by_side`) is plain Python over numbers, so it is tested on
synthetic input; :func:`sim_overall` runs the simulator (SimPy, CPU only)."""

from __future__ import annotations

from workbench.labs.colocation.params import spread

STEP_FIELDS = ("flops_eff", "bw_eff", "step_overhead_s", "seq_overhead_s", "prefill_overhead_s")


def sweep_steps(reps: list[dict]) -> list[list[float]]:
    """Every measured step of a sweep as the fit's rows ``[num_seqs, new_tokens, ctx_tokens,
    attn_pairs, seconds]`` (the raw rows start with the instance index)."""
    return [s[1:6] for r in reps for run in r["runs"].values() for s in run["steps"]]


def gpu_points(reps: list[dict]) -> dict[tuple[int, str], dict[str, dict]]:
    """(PEAK, mode) -> {"p50"|"p99"|"mean": spread over repeats, ms}."""
    out: dict[tuple[int, str], dict[str, dict]] = {}
    keys = {k for r in reps for k in r["runs"]}
    for key in keys:
        peak, mode = key.split("/")
        runs = [r["runs"][key]["overall"]["ttft"] for r in reps if key in r["runs"]]
        out[(int(peak), mode)] = {s: spread([1e3 * t[s] for t in runs])
                                  for s in ("p50", "p99", "mean")}
    return out


def side_by_side(gpu: dict[tuple[int, str], dict[str, dict]],
                 sim: dict[tuple[int, str], dict[str, float]], *, p50_tol: float = 0.15,
                 p99_tol: float = 0.25) -> dict:
    """Rows per (PEAK, mode) in both: GPU median [min, max], sim, sim/GPU, and whether the sim is
    within ``p50_tol`` / ``p99_tol`` (relative) of the GPU's median; counts of points meeting
    each target and both."""
    rows = []
    for key in sorted(set(gpu) & set(sim)):
        g, s = gpu[key], sim[key]
        row: dict = {"peak": key[0], "mode": key[1]}
        for stat, tol in (("p50", p50_tol), ("p99", p99_tol)):
            ratio = s[stat] / g[stat]["median"]
            row[stat] = {"gpu": g[stat], "sim": s[stat], "ratio": ratio,
                         "ok": abs(ratio - 1.0) <= tol,
                         "inside_gpu_range": g[stat]["min"] <= s[stat] <= g[stat]["max"]}
        row["ok"] = row["p50"]["ok"] and row["p99"]["ok"]
        rows.append(row)
    return {"rows": rows, "points": len(rows),
            "p50_ok": sum(r["p50"]["ok"] for r in rows),
            "p99_ok": sum(r["p99"]["ok"] for r in rows),
            "both_ok": sum(r["ok"] for r in rows),
            "p50_in_gpu_range": sum(r["p50"]["inside_gpu_range"] for r in rows),
            "p99_in_gpu_range": sum(r["p99"]["inside_gpu_range"] for r in rows),
            "tolerance": {"p50": p50_tol, "p99": p99_tol}}


def table_md(table: dict) -> str:
    lines = ["| PEAK | mode | GPU p50 median [min-max] | sim p50 | sim/GPU | GPU p99 median "
             "[min-max] | sim p99 | sim/GPU | both within |", "|---" * 9 + "|"]

    def g(d: dict) -> str:
        return f"{d['median']:,.0f} [{d['min']:,.0f}-{d['max']:,.0f}]"

    for r in table["rows"]:
        a, b = r["p50"], r["p99"]
        lines.append(f"| {r['peak']} | {r['mode']} | {g(a['gpu'])} | {a['sim']:,.0f} | "
                     f"{a['ratio']:.2f}{'' if a['ok'] else ' (off)'} | {g(b['gpu'])} | "
                     f"{b['sim']:,.0f} | {b['ratio']:.2f}{'' if b['ok'] else ' (off)'} | "
                     f"{'yes' if r['ok'] else 'no'} |")
    t = table["tolerance"]
    lines += ["", f"p50 within {t['p50']:.0%}: {table['p50_ok']}/{table['points']}; p99 within "
              f"{t['p99']:.0%}: {table['p99_ok']}/{table['points']}; both: "
              f"{table['both_ok']}/{table['points']}. Sim inside the GPU's min-max over repeats: "
              f"p50 {table['p50_in_gpu_range']}/{table['points']}, p99 "
              f"{table['p99_in_gpu_range']}/{table['points']}."]
    return "\n".join(lines)


def speedups_md(sim: dict[tuple[int, str], dict[str, float]]) -> str:
    """Static / elastic mean and p99 TTFT per PEAK of one simulated sweep."""
    lines = ["| PEAK | mean static / elastic | speedup | p99 static / elastic | speedup |",
             "|---|---|---|---|---|"]
    for p in sorted({k[0] for k in sim}):
        if (p, "static") not in sim or (p, "elastic") not in sim:
            continue
        s, e = sim[(p, "static")], sim[(p, "elastic")]
        lines.append(f"| {p} | {s['mean']:,.0f} / {e['mean']:,.0f} | {s['mean'] / e['mean']:.2f}x"
                     f" | {s['p99']:,.0f} / {e['p99']:,.0f} | {s['p99'] / e['p99']:.2f}x |")
    return "\n".join(lines)


def sim_overall(c: dict, peak: int, mode: str, steptime: dict,
                serial_host: bool = True, one_thread: bool | None = None) -> dict:
    """The GPU sweep's workload at ``peak`` (config ``c``: the sweep's ColoConfig as a dict) on
    the simulated H200: the same budget (static: split evenly; elastic: shared, each pool's
    virtual range the whole budget), the same reserve and mapper, the same scaled ramp.
    ``serial_host``: one driver thread steps every engine in turn, as the GPU lab does, so a
    step's host part also holds the GPU turn; ``one_thread`` (default: ``serial_host``) also
    schedules each step inside that turn (``engines.sim.driver.HOST_MODES``)."""
    from workbench.engines.sim.cluster import run_cluster
    from workbench.labs.colocation.sim import sweep_cluster

    host = ("one_thread" if (serial_host if one_thread is None else one_thread)
            else "serial" if serial_host else "parallel")
    cfg, workload = sweep_cluster(
        c, peak, mode, {k: steptime[k] for k in STEP_FIELDS if k in steptime}, host=host,
        model="llama-3.1-8b", usable=1.0, prealloc=bool(c.get("mapper", False)), blocks=False)
    return run_cluster(cfg, workload()).overall.as_dict()


def sim_points(c: dict, steptime: dict, keys) -> dict[tuple[int, str], dict[str, float]]:
    out = {}
    for peak, mode in keys:
        o = sim_overall(c, peak, mode, steptime)
        out[(peak, mode)] = {s: 1e3 * o["ttft"][s] for s in ("p50", "p99", "mean")}
    return out
