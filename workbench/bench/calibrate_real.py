"""``workbench.bench.calibrate``'s real-engine path: step logs or real colocation records, one
fit of the step-time model (:func:`workbench.bench.stepfit.fit_steptime`: the efficiencies by
grid search, the overheads by least squares on the relative error), its residuals, and the fit
kept as a named profile in ``hardware.py`` with where it comes from."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np

from workbench.bench import steprows
from workbench.bench.stepfit import fit_steptime
from workbench.bench.steprows import Workload
from workbench.errors import ConfigError
from workbench.names import name_problem

FIELDS = ("flops_eff", "bw_eff", "step_overhead_s", "seq_overhead_s", "prefill_overhead_s")
LOG_SUFFIXES = (".jsonl", ".log")


def _ints(text: str | None, what: str) -> set[int] | None:
    if text is None:
        return None
    try:
        return {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise ConfigError(f"{what} {text!r}", "is not a comma-separated list of integers",
                          f"write e.g. {what} 0,2") from None


def gather(args: argparse.Namespace) -> tuple[list[list[float]], dict]:
    """The fit's rows from every input, and what the provenance says about them."""
    repeats, peaks = _ints(args.repeats, "--repeats"), _ints(args.peaks, "--peaks")
    logs = [p for p in args.inputs if p.is_file() and p.suffix in LOG_SUFFIXES]
    records = [p for p in args.inputs if p not in logs]
    wl = Workload(args.prompt_len, args.output_len) if args.prompt_len and args.output_len \
        else None
    rows: list[list[float]] = []
    info: dict = {"source": [p.name for p in args.inputs], "machine": None, "engine": None,
                  "model": None, "points": [], "ctx": "logged", "engines": [], "reps": []}
    if logs:
        engines = [steprows.read_log(p) for p in logs]
        info["engines"].append(engines)
        if any(s.ctx is None for e in engines for s in e):
            info["ctx"] = _ctx_note(wl)
        rows += steprows.fit_rows(engines, wl, solo=not args.all_steps)
    for path in records:
        for rep in steprows.load_record(path):
            if repeats is not None and rep.get("repeat") not in repeats:
                continue
            info["reps"].append(rep)
            rows += _record_rows(rep, peaks, wl, args, info)
    if not rows:
        raise ConfigError("the inputs", "hold no steps to fit (after --repeats/--peaks and "
                          "the solo filter)", "pass logs or records with steps, or --all-steps")
    return rows, info


def _ctx_note(wl: Workload | None) -> str:
    return (f"estimated (prompt {wl.prompt_len}, output {wl.output_len})" if wl else "estimated")


def _record_rows(rep: dict, peaks: set[int] | None, wl: Workload | None,
                 args: argparse.Namespace, info: dict) -> list[list[float]]:
    wl = wl or steprows.workload_of(rep)
    info["machine"] = info["machine"] or rep.get("device")
    info["engine"] = info["engine"] or (f"vllm {rep['vllm_version']}"
                                        if rep.get("vllm_version") else rep.get("engine"))
    info["model"] = info["model"] or (rep.get("config") or {}).get("model")
    info["measured"] = info.get("measured") or (rep.get("provenance") or {}).get("date")
    out: list[list[float]] = []
    for key in sorted(rep["runs"]):
        if peaks is not None and int(key.split("/")[0]) not in peaks:
            continue
        engines = steprows.record_steps(rep, key)
        if not engines:
            continue
        if any(s.ctx is None for e in engines for s in e):
            info["ctx"] = _ctx_note(wl)
        got = steprows.fit_rows(engines, wl, solo=not args.all_steps)
        info["engines"].append(engines)
        out += got
        info["points"].append(f"r{rep.get('repeat')} {key} ({len(got)})")
    return out


def residuals(rows: list[list[float]], fields: dict, gpu: str, model: str) -> dict:
    """Median and p90 relative error of the fitted model, overall and per kind of period:
    decode only, or holding a prefill's host cost (``prefill_host``, see steprows)."""
    from workbench.engines.sim.steptime import StepTimeModel

    st = StepTimeModel.preset(model, gpu, **fields)
    a = np.asarray(rows, dtype=float)
    host = a[:, 5] if a.shape[1] > 5 else (a[:, 1] > a[:, 0]).astype(float)
    gpu_s = np.array([st.cost(int(r[0]), int(r[1]), r[2], r[3]).gpu_s for r in a])
    pred = gpu_s + st.step_overhead_s + st.seq_overhead_s * a[:, 0] + \
        st.prefill_overhead_s * host
    rel = np.abs(pred - a[:, 4]) / a[:, 4]
    kinds = {"all": np.ones(len(a), bool), "decode_only": (a[:, 1] <= a[:, 0]) & (host == 0),
             "prefill_host": host > 0}
    return {k: {"steps": int(m.sum()), "median_rel_err": round(float(np.median(rel[m])), 4),
                "p90_rel_err": round(float(np.percentile(rel[m], 90)), 4)}
            for k, m in kinds.items() if m.any()}


def run(args: argparse.Namespace) -> dict:
    from workbench.bench.profiles import DEFAULT, write_profile
    from workbench.engines.models import get_model
    from workbench.engines.sim.steptime import GPUS

    if args.gpu not in GPUS:
        raise ConfigError(f"--gpu {args.gpu!r}", "has no preset", f"use one of {', '.join(GPUS)}")
    if args.name is not None and name_problem(args.name) is not None:
        raise ConfigError(f"--name {args.name!r}", "is not a profile name",
                          "use letters, digits, '-', '_' or '.', e.g. vllm26-h200")
    rows, info = gather(args)
    model = args.model or info["model"] or "llama-3.1-8b"
    get_model(model)  # an unknown shape is refused before fitting
    fit = fit_steptime(rows, gpu=args.gpu, model=model, prefill_term=True)
    fields = {k: float(f"{fit[k]:.4g}") for k in FIELDS}
    res = residuals(rows, fields, args.gpu, model)
    points = info.pop("engines")
    switch = _gpu_switch(points, fields)
    fields["noise_sd"] = _noise_sd(rows, fields, args.gpu, model)
    # a prefill period beside a decoding engine: its own kernels and two turns of the GPU (to it
    # and back) are charged by the model already
    share = _gpu_share(points, fields, _prefill_gpu_s(rows, fields, args.gpu, model)
                       + 2 * fields.get("gpu_switch_s", 0.0))
    from workbench.bench.engine_facts import facts

    eng = facts(info.pop("reps"), model) if info["reps"] else None
    print(json.dumps({"fields": fields, "steps": len(rows), "dropped": fit["n_dropped"],
                      "residuals": res}, indent=1))
    for kind, r in res.items():
        print(f"{kind}: {r['steps']} steps, relative error median {r['median_rel_err']:.1%}, "
              f"p90 {r['p90_rel_err']:.1%}")
    profile = {"gpu": args.gpu, "model": model, "fields": fields, **(
        {"engine": eng["engine"]} if eng else {}), "provenance": {
        "machine": args.machine or info["machine"] or "not recorded",
        "engine": args.engine_version or info["engine"] or "not recorded",
        "model_shape": model, "measured": info.get("measured") or "not recorded",
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
        "steps_used": len(rows), "steps_dropped": fit["n_dropped"],
        "solo_steps_only": not args.all_steps, "context": info["ctx"],
        "median_rel_err": res["all"]["median_rel_err"], "p90_rel_err": res["all"]["p90_rel_err"],
        "residuals": res, "prefill_gpu_share": share, "gpu_switch": switch,
        "engine_facts": eng["read_from"] if eng else None,
        "fitted_on": {"repeats": args.repeats or "all", "peaks": args.peaks or "all",
                      "points": info["points"]},
        "source": info["source"], "command": "python -m workbench.bench.calibrate " + " ".join(
            _shown_args(sys.argv[1:] if args.argv is None else args.argv))}}
    if args.name:
        path = write_profile(args.name, profile, args.hardware or DEFAULT)
        print(f"profile {args.name!r} written to {path.name}; select it with --param "
              f"steptime={args.name}")
    return profile


def _noise_sd(rows: list[list[float]], fields: dict, gpu: str, model: str) -> float:
    """How far a real step scatters around the model: the robust sd (1.4826 x the median
    absolute deviation from 0) of log(measured / modelled) over the fitted steps."""
    from workbench.engines.sim.steptime import StepTimeModel

    st = StepTimeModel.preset(model, gpu, **fields)
    a = np.asarray(rows, dtype=float)
    host = a[:, 5] if a.shape[1] > 5 else (a[:, 1] > a[:, 0]).astype(float)
    pred = np.array([st.cost(int(r[0]), int(r[1]), r[2], r[3]).gpu_s for r in a]) + \
        st.step_overhead_s + st.seq_overhead_s * a[:, 0] + st.prefill_overhead_s * host
    return round(float(1.4826 * np.median(np.abs(np.log(a[:, 4] / pred)))), 3)


def _prefill_gpu_s(rows: list[list[float]], fields: dict, gpu: str, model: str) -> float:
    """The model's own GPU time (roofline) of the median step that computes a prefill."""
    from workbench.engines.sim.steptime import StepTimeModel

    st = StepTimeModel.preset(model, gpu, **fields)
    got = sorted(st.cost(int(r[0]), int(r[1]), r[2], r[3]).gpu_s for r in rows if r[1] > r[0])
    return got[len(got) // 2] if got else 0.0


def _gpu_share(points: list, fields: dict, own_gpu_s: float = 0.0) -> dict | None:
    """``prefill_gpu_frac`` from the fitted points' shared-GPU periods (steprows), set in
    ``fields``; what it was read from, for the provenance (None: not measurable here). The GPU
    time others lose to a prefill period holds the prefill's own kernels too, which the model
    charges already (``own_gpu_s``: its roofline, and the GPU's turns to it and back): only the
    rest is the host cost's share."""
    share = steprows.prefill_gpu_share(points) if any(len(p) > 1 for p in points) else None
    if share is None or fields["prefill_overhead_s"] <= 0:
        return None
    share["own_gpu_s"] = own_gpu_s
    frac = min(max((share["gpu_s"] - own_gpu_s) / fields["prefill_overhead_s"], 0.0), 1.0)
    fields["prefill_gpu_frac"] = round(frac, 3)
    print(f"prefill_gpu_frac {frac:.3f}: a decode beside another engine's prefill period took "
          f"{share['beside_s'] * 1e3:.1f} ms, alone {share['base_s'] * 1e3:.1f} ms "
          f"({share['n_beside']} / {share['n_base']} periods)")
    return {k: round(v, 5) if isinstance(v, float) else v for k, v in share.items()}


def _gpu_switch(points: list, fields: dict) -> dict | None:
    """``gpu_switch_s`` from the fitted points' small decodes beside other engines' decodes
    (steprows), set in ``fields``; what it was read from (None: not measurable here)."""
    got = steprows.gpu_switch(points) if any(len(p) > 1 for p in points) else None
    if got is None:
        return None
    fields["gpu_switch_s"] = round(got["switch_s"], 6)
    print(f"gpu_switch_s {got['switch_s'] * 1e3:.2f} ms: a small decode alone took "
          f"{got['base_s'] * 1e3:.1f} ms, beside one decoding engine "
          f"{got.get('beside1_s', 0) * 1e3:.1f}, beside two {got.get('beside2_s', 0) * 1e3:.1f}")
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in got.items()}


def _shown_args(argv: list[str]) -> list[str]:
    """The command line without folders (a machine path never lands in the repository)."""
    return [Path(a).name if "/" in a else a for a in argv]
