"""The simulator beside a real colocation sweep: the record's own workload and PEAKs run on the
simulated H200 with a step-time profile fitted to real engine steps (``hardware.STEP_PROFILES``),
TTFT p50 and p99 per (PEAK, mode) against the real median over repeats, and the sim's speedups
beside the real ones.

Held out: a profile fitted on some repeats or PEAKs of this sweep (its provenance says which)
is judged on the rest; a point the fit saw counts as in-sample. The simulated cluster matches the
real one where the record says how: the same KV total (static: split evenly; elastic: one shared
budget every pool may address), the same scaled ramp and seed, vLLM's ``max_num_seqs`` and token
budget; each engine its own process, so a step's host part overlaps the others' GPU steps
(``host="parallel"``). Runs on a CPU (SimPy)."""

from __future__ import annotations

import statistics
from dataclasses import replace

from workbench.config import PoolConfig
from workbench.hardware import STEP_PROFILES
from workbench.labs.colocation.rows import spread

P50_TOL, P99_TOL = 0.15, 0.25
SIM_REPEATS = 3
# what a profile says of the real engine besides its step times (``profile["engine"]``), and
# the simulator's answer without them (a profile fitted before they were measured)
ENGINE_DEFAULTS = {"async_scheduling": False, "kv_blocks_first": False, "client_s": 0.0}
FIELDS = ("flops_eff", "bw_eff", "step_overhead_s", "seq_overhead_s", "prefill_overhead_s",
          "prefill_gpu_frac", "gpu_switch_s", "noise_sd")


def _repeats(record) -> list[dict]:
    """The repeats of a repeat dict, a list of them, ``{"repeats": [...]}`` or a lab record
    (``results.repeats`` beside ``results.config``); each with its sweep's config."""
    if isinstance(record, dict) and isinstance(record.get("results"), dict):
        record = record["results"]
    if isinstance(record, dict) and isinstance(record.get("runs"), dict):
        return [record]
    reps = record.get("repeats") if isinstance(record, dict) else record
    head = record if isinstance(record, dict) else {}
    out = []
    for r in reps or ():
        if isinstance(r, dict) and isinstance(r.get("runs"), dict):
            out.append({**{k: head[k] for k in ("config", "engine", "device", "provenance")
                           if k in head},
                        **r})
    return out


def pick_profile(reps: list[dict], name: str | None = None) -> tuple[str, dict] | None:
    """``name``'s profile, else the fitted profile of the record's model shape on an engine of
    the record's kind (the newest by date); None when none exists."""
    if name is not None:
        return (name, STEP_PROFILES[name]) if name in STEP_PROFILES else None
    model = (reps[0].get("config") or {}).get("model", "llama-3.1-8b") if reps else None
    kind = str(reps[0].get("engine", "vllm")) if reps else "vllm"
    fits = [(p["provenance"].get("date", ""), n, p) for n, p in STEP_PROFILES.items()
            if p.get("model") == model and kind in str(p["provenance"].get("engine", ""))]
    return max(fits)[1:] if fits else None


def _fitted_set(text, all_: set[int]) -> set[int]:
    if text in (None, "all"):
        return set(all_)
    return {int(x) for x in str(text).split(",") if x.strip()}


def fitted_on_this(reps: list[dict], prov: dict) -> bool:
    """Whether the profile was fitted on this sweep: its steps were measured at this sweep's
    start (a profile without that date is taken as fitted here, the cautious reading)."""
    measured = prov.get("measured")
    dates = {(r.get("provenance") or {}).get("date") for r in reps}
    return measured in (None, "not recorded") or measured in dates


def real_points(reps: list[dict]) -> dict[tuple[int, str], dict[int, dict]]:
    """(PEAK, mode) -> repeat -> the point's overall TTFT (ms: p50, p99, mean)."""
    out: dict[tuple[int, str], dict[int, dict]] = {}
    for rep in reps:
        for key, run in rep["runs"].items():
            peak, mode = key.split("/")
            t = run["overall"]["ttft"]
            out.setdefault((int(peak), mode), {})[rep.get("repeat", 0)] = \
                {s: 1e3 * t[s] for s in ("p50", "p99", "mean")}
    return out


def sweep_cluster(c: dict, peak: int, mode: str, steptime: dict, *, gpu: str = "h200",
                  host: str = "parallel", model: str | None = None, usable: float | None = None,
                  prealloc: bool | None = None, engine: dict | None = None,
                  blocks: bool = True):
    """A real colocation sweep's workload at ``peak`` on the simulated GPU -- the one place the
    simulator is set up beside a real sweep (this module's prediction and
    ``bench/simgpu.py``'s table): (the cluster config, a function making the workload). ``c``
    is the sweep's config; the same KV total (static: split evenly; elastic: one shared budget
    every pool may address, less what a pool keeps free of it, ``usable``), the same reserve,
    scaled ramp and seed, vLLM's ``max_num_seqs`` and token budget; ``engine``: what the
    profile measured of the real engine (``ENGINE_DEFAULTS``); ``blocks``: the static pool's
    block count from the record; ``prealloc`` None: the pool's default."""
    from workbench.engines.models import get_model
    from workbench.engines.sim.cluster import ClusterConfig
    from workbench.engines.sim.steptime import GPUS
    from workbench.engines.sim.vllm_like import VLLMOptions
    from workbench.engines.sim.workloads import ramp_trace

    e = {**ENGINE_DEFAULTS, **(engine or {})}
    spec, model_ = GPUS[gpu], get_model(model or c.get("model", "llama-3.1-8b"))
    budget, n = int(c["budget_gib"] * (1 << 30)), int(c["instances"])
    if usable is None:
        usable = float(c.get("gpu_utilization", PoolConfig().gpu_utilization))
    scale = float(c["time_scale"])
    out_len = max(2, round(c["completion_len"] / scale))
    pool = replace(PoolConfig(), min_reserved_pages=int(c.get("min_reserved_pages", 0)),
                   max_reserved_pages=int(c.get("max_reserved_pages", 1)))
    if prealloc is not None:
        pool = replace(pool, prealloc=prealloc)
    cfg = ClusterConfig(
        mode=mode, gpu=gpu, model=model_.name, num_instances=n, activation_bytes=0,
        gpu_memory_utilization=(budget / n + model_.weight_bytes) / spec.memory_bytes,
        # a real pool sees the shared budget as its device (core/budget_device) and keeps
        # 1 - gpu_utilization of it free, as of any device: the pools share that much less
        kv_gpu_utilization=(n * model_.weight_bytes + budget * usable) / spec.memory_bytes,
        kv_virtual_bytes=budget, pool=pool,
        vllm=VLLMOptions(max_num_seqs=int(c["max_num_seqs"]),
                         max_num_batched_tokens=int(c["max_batched_tokens"]),
                         async_scheduling=bool(e["async_scheduling"]),
                         kv_blocks_first=bool(e["kv_blocks_first"]),
                         num_gpu_blocks_override=(c.get("blocks") or {}).get("static")
                         if blocks else None),
        steptime=dict(steptime), seed=int(c.get("seed", 0)), host=host)

    def workload() -> list:
        wl = []
        for i in range(n):
            reqs = ramp_trace(peak, i, num_models=n, prompt_len=int(c["prompt_len"]),
                              output_len=out_len, seed=int(c.get("seed", 0)))
            for r in reqs:
                r.arrival /= scale
            wl.append(reqs)
        return wl

    return cfg, workload


def sim_point(c: dict, peak: int, mode: str, fields: dict, gpu: str = "h200",
              engine: dict | None = None) -> dict:
    """The record's workload at ``peak`` on the simulated GPU: TTFT ms (p50, p99, mean).
    ``engine``: what the profile measured of the real engine beyond step times
    (``ENGINE_FACTS``): async scheduling, the KV tensor's layout, the streaming client's own
    latency (added to every TTFT, as the real client's clock includes it)."""
    from workbench.engines.sim.cluster import run_cluster

    e = {**ENGINE_DEFAULTS, **(engine or {})}
    cfg, workload = sweep_cluster(c, peak, mode, fields, gpu=gpu, engine=e)
    # noisy steps (the fit's scatter): the median of SIM_REPEATS runs, as the real is the
    # median over its repeats; exact steps: one run
    runs = []
    for k in range(SIM_REPEATS if fields.get("noise_sd") else 1):
        cfg.steptime = {**dict(fields), "noise_seed": k}
        runs.append(run_cluster(cfg, workload()).overall.as_dict()["ttft"])
    return {s: 1e3 * (statistics.median(o[s] for o in runs) + float(e["client_s"]))
            for s in ("p50", "p99", "mean")}


def _row(key, by_rep: dict[int, dict], held: set[int], sim: dict, peak_held: bool) -> dict:
    out_reps = [r for r in by_rep if r in held] or list(by_rep)
    row: dict = {"peak": key[0], "mode": key[1],
                 "held_out": peak_held or any(r in held for r in by_rep),
                 "judged_on_repeats": sorted(out_reps)}
    for stat, tol in (("p50", P50_TOL), ("p99", P99_TOL)):
        real = spread([by_rep[r][stat] for r in out_reps])
        ratio = sim[stat] / real["median"] if real["median"] > 0 else float("inf")
        row[stat] = {"real": real, "sim": sim[stat], "ratio": ratio,
                     "ok": abs(ratio - 1.0) <= tol}
    row["ok"] = row["p50"]["ok"] and row["p99"]["ok"]
    return row


def speedups(real: dict, sim: dict) -> list[dict]:
    """Per PEAK: static / elastic TTFT (mean and p99), real (median [min, max] over repeats)
    beside the sim's."""
    out = []
    for p in sorted({k[0] for k in real}):
        s, e = real.get((p, "static"), {}), real.get((p, "elastic"), {})
        both = [r for r in s if r in e]
        if not both or (p, "static") not in sim or (p, "elastic") not in sim:
            continue
        row: dict = {"peak": p}
        for stat in ("mean", "p99"):
            row[stat] = {"real": spread([s[r][stat] / e[r][stat] for r in both]),
                         "sim": sim[(p, "static")][stat] / sim[(p, "elastic")][stat]}
        out.append(row)
    return out


def sim_beside_real(record, profile: str | None = None) -> dict | None:
    """Per-point rows (real vs sim TTFT p50 and p99 per mode, within 15% / 25%), counts within
    tolerance (all points and held-out ones), the sim's speedups beside the real ones; None when
    no fitted profile exists for the record's engine and model."""
    reps = _repeats(record)
    got = pick_profile(reps, profile)
    if not reps or got is None:
        return None
    name, prof = got
    fitted = prof["provenance"].get("fitted_on", {})
    all_reps = {r.get("repeat", 0) for r in reps}
    real = real_points(reps)
    held = all_reps - _fitted_set(fitted.get("repeats"), all_reps)
    fit_peaks = _fitted_set(fitted.get("peaks"), {k[0] for k in real})
    here = fitted_on_this(reps, prof["provenance"])
    if not here:  # another sweep: every point held out
        held, fit_peaks = all_reps, set()
    fields = {k: prof["fields"][k] for k in FIELDS if k in prof["fields"]}
    c = reps[0]["config"]
    gpu, engine = prof.get("gpu", "h200"), prof.get("engine")
    sim = {key: sim_point(c, key[0], key[1], fields, gpu, engine)
           for key in sorted(real)}
    rows = [_row(key, real[key], held, sim[key], key[0] not in fit_peaks) for key in sorted(real)]
    out_rows = [r for r in rows if r["held_out"]]
    return {"profile": name, "provenance": prof["provenance"], "fields": fields,
            "engine": prof.get("engine"), "fitted_here": here,
            "tolerance": {"p50": P50_TOL, "p99": P99_TOL}, "rows": rows,
            "points": len(rows), "p50_ok": sum(r["p50"]["ok"] for r in rows),
            "p99_ok": sum(r["p99"]["ok"] for r in rows), "both_ok": sum(r["ok"] for r in rows),
            "held_out_points": len(out_rows), "held_out_both_ok": sum(r["ok"] for r in out_rows),
            "speedups": speedups(real, sim)}


def _provenance(pred: dict) -> list[str]:
    """Where the profile comes from: what it was fitted on, what it measured of the engine."""
    prov, eng = pred["provenance"], pred.get("engine") or {}
    fit = prov.get("fitted_on") or {}
    out = [f"* fitted on: {', '.join(prov.get('source') or ['?'])} (measured "
           f"{prov.get('measured', '?')}), repeats {fit.get('repeats', '?')}, PEAKs "
           f"{fit.get('peaks', '?')}; this sweep {'is' if pred['fitted_here'] else 'is not'} "
           "among them", f"* command: `{prov.get('command', '?')}` ({prov.get('date', '?')})"]
    if eng:
        read = prov.get("engine_facts") or {}
        out.append(f"* engine facts: KV blocks first {eng.get('kv_blocks_first')} (the pools "
                   f"mapped {read.get('mapped_step_mib')} MiB page ids), async scheduling "
                   f"{eng.get('async_scheduling')}, client latency added "
                   f"{1e3 * eng.get('client_s', 0):.1f} ms (measured "
                   f"{1e3 * (read.get('client_s_measured') or 0):.1f} ms over "
                   f"{read.get('client_requests')} first requests)")
    f = pred["fields"]
    out.append(f"* shared GPU: a turn between engines {1e3 * f.get('gpu_switch_s', 0):.2f} ms, "
               f"a prefill's host cost holds it {f.get('prefill_gpu_frac', 0):.0%}; steps "
               f"scatter by sd {f.get('noise_sd', 0):.3f} (log), the sim's TTFT the median of "
               f"{SIM_REPEATS if f.get('noise_sd') else 1} run(s); the pools keep "
               f"{1 - PoolConfig().gpu_utilization:.0%} of the shared budget free, as the real "
               "ones do of the device they see")
    return out


def markdown(pred: dict) -> str:
    """The prediction as the lab report's section: per point, then the speedups."""
    prov = pred["provenance"]
    lines = [f"Simulator with step profile `{pred['profile']}` (fitted on {prov.get('machine')}, "
             f"{prov.get('engine')}, {prov.get('steps_used')} steps, median error "
             f"{prov.get('median_rel_err', 0):.1%}); real: median [min-max] over the repeats a "
             "point is judged on; TTFT ms.", "", *_provenance(pred), "",
             "| PEAK | mode | held out | real p50 | sim p50 | sim/real | real p99 | sim p99 | "
             "sim/real | both within |", "|---" * 10 + "|"]

    def g(d: dict) -> str:
        return f"{d['median']:,.0f} [{d['min']:,.0f}-{d['max']:,.0f}]"

    for r in pred["rows"]:
        a, b = r["p50"], r["p99"]
        lines.append(f"| {r['peak']} | {r['mode']} | {'yes' if r['held_out'] else 'no'} | "
                     f"{g(a['real'])} | {a['sim']:,.0f} | {a['ratio']:.2f}"
                     f"{'' if a['ok'] else ' (off)'} | {g(b['real'])} | {b['sim']:,.0f} | "
                     f"{b['ratio']:.2f}{'' if b['ok'] else ' (off)'} | "
                     f"{'yes' if r['ok'] else 'no'} |")
    t = pred["tolerance"]
    lines += ["", f"p50 within {t['p50']:.0%}: {pred['p50_ok']}/{pred['points']}; p99 within "
              f"{t['p99']:.0%}: {pred['p99_ok']}/{pred['points']}; both: {pred['both_ok']}/"
              f"{pred['points']}; held out, both: {pred['held_out_both_ok']}/"
              f"{pred['held_out_points']}.", "",
              "| PEAK | real mean speedup | sim | real p99 speedup | sim |", "|---" * 5 + "|"]
    for s in pred["speedups"]:
        m, p = s["mean"], s["p99"]
        lines.append(f"| {s['peak']} | {m['real']['median']:.2f}x [{m['real']['min']:.2f}-"
                     f"{m['real']['max']:.2f}] | {m['sim']:.2f}x | {p['real']['median']:.2f}x "
                     f"[{p['real']['min']:.2f}-{p['real']['max']:.2f}] | {p['sim']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench.labs.colocation.predict RECORD [--profile NAME]``: the per-point
    table (predicted vs real TTFT p50/p99, within tolerance or not) for a saved sweep."""
    import argparse
    import sys

    from workbench.errors import WorkbenchError
    from workbench.labs.colocation.saved import merged

    ap = argparse.ArgumentParser(description="the simulator's TTFT beside a real sweep's")
    ap.add_argument("record", help="a real sweep's repeats: a saved .repeats.json.gz or out_dir")
    ap.add_argument("--profile", help="step profile (default: the newest for the record)")
    args = ap.parse_args(argv)
    try:
        pred = sim_beside_real(merged(args.record), args.profile)
    except WorkbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if pred is None:
        print("error: no fitted step profile for this record's engine and model. Fix: fit one "
              "with python -m workbench.bench.calibrate RECORD --name NAME", file=sys.stderr)
        return 2
    print(markdown(pred))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
