"""A real-vLLM colocation sweep's repeat files as the lab's
:class:`~workbench.labs.colocation.params.ColocationRun`: the setup, per-instance tables, where
the time went, each mode's memory, the per-page map costs, the modes that did not run, the
simulator beside it and the record fields only a real-vLLM run knows. The runner
(:mod:`~workbench.labs.colocation.server`) hands its repeats here; so does a ``from_dir`` run
reading saved ones back."""

from __future__ import annotations

from dataclasses import asdict

from workbench.engines.real import kvcached
from workbench.errors import ConfigError
from workbench.labs.colocation.params import (
    ColocationParams,
    ColocationRun,
    merged,
    reading_sweep,
    spread,
)
from workbench.labs.colocation.server import command_line, config_for, gib, sweep
from workbench.labs.colocation.sim import prediction_markdown, sim_beside_real
from workbench.labs.kit.base import Progress
from workbench.labs.kit.record import Manifest


def run_server(params: ColocationParams, backend: str,
               progress: Progress | None = None) -> ColocationRun:
    """The lab's ``server`` family on ``gpu``/``host``: the sweep on real vLLM servers, or its
    repeat files read back (several calls' folders merged)."""
    if params.from_dir:
        reps = merged(params.from_dir)
        with reading_sweep(f"from_dir={params.from_dir!r}"):
            return from_repeats(reps, backend)
    cfg = config_for(params, backend)
    done, total = [0], len(cfg.peaks) * len(cfg.modes) * cfg.repeats

    def log(msg: str) -> None:
        print(msg, flush=True)
        done[0] += 1
        if progress is not None:
            progress(done[0], total, msg.split(":")[0])

    reps = sweep(cfg, log=log)
    if not any(r["runs"] for r in reps):
        raise ConfigError("the colocation sweep on real vLLM", "finished no point",
                          "raise deadline_s or run fewer peaks")
    return from_repeats([r for r in reps if r["runs"]], backend)

def _sp(sp: dict, fmt: str = ".3f") -> str:
    return f"{sp['median']:{fmt}} [{sp['min']:{fmt}}-{sp['max']:{fmt}}]"


def _med(values: list[float]) -> float:
    return spread(values)["median"] if values else float("nan")


def _runs(reps: list[dict], key: str) -> list[dict]:
    return [r["runs"][key] for r in reps if key in r["runs"]]


def per_instance(reps: list[dict], peaks: list[int], modes: list[str]) -> list[str]:
    lines = ["## Per instance (median over repeats)", "",
             "Instance i's ramp starts after instance i-1's; mean / p99 TTFT ms and vLLM's "
             "preemptions, per instance 0 / 1 / 2.", "",
             "| PEAK | mode | mean TTFT ms | p99 TTFT ms | preemptions | finished |",
             "|---|---|---|---|---|---|"]
    for p in peaks:
        for m in modes:
            rs = _runs(reps, f"{p}/{m}")
            if not rs:
                continue
            n = len(rs[0]["instances"])

            def col(f, rs=rs, n=n) -> str:
                return " / ".join(f"{_med([f(r['instances'][i]) for r in rs]):,.0f}"
                                  for i in range(n))
            lines.append(f"| {p} | {m} | {col(lambda d: d['ttft']['mean'] * 1e3)} | "
                         f"{col(lambda d: d['ttft']['p99'] * 1e3)} | "
                         f"{col(lambda d: d['preemptions'])} | {col(lambda d: d['finished'])} |")
    return lines + [""]


def where_time_went(reps: list[dict], peaks: list[int], modes: list[str]) -> list[str]:
    lines = ["## Where the time went (median over repeats)", "",
             "wall: first arrival to last finish; steps and step s: the engines' scheduler steps "
             "and their summed duration (where step logs were written); peak mapped: the most "
             "KV the elastic pools had mapped together; free min: the device's least free "
             "memory during the point.", "",
             "| PEAK | mode | wall s | preemptions | lost | steps | step s | TPOT ms | "
             "peak mapped GiB | free min GiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in peaks:
        for m in modes:
            rs = _runs(reps, f"{p}/{m}")
            if not rs:
                continue
            st = [[s for s in r["steps"] or [] if s] for r in rs]
            steps = [sum(len(s["rows"]) for s in x) for x in st]
            step_s = [sum(row[1] for s in x for row in s["rows"]) for x in st]
            logged = any(st)
            mp = [r["mapped_peak_bytes"] for r in rs if r.get("mapped_peak_bytes") is not None]
            fm = [r["free_min"] for r in rs if r.get("free_min") is not None]
            lines.append(
                f"| {p} | {m} | {_med([r['wall_s'] for r in rs]):.1f} | "
                f"{_med([r['overall']['preemptions'] for r in rs]):.0f} | "
                f"{_med([r['lost'] for r in rs]):.0f} | "
                f"{f'{_med(steps):.0f}' if logged else '-'} | "
                f"{f'{_med(step_s):.1f}' if logged else '-'} | "
                f"{_med([r['overall']['tpot']['mean'] * 1e3 for r in rs]):.1f} | "
                f"{gib(_med(mp)) if mp else '-'} | {gib(_med(fm)) if fm else '-'} |")
    return lines + [""]


def startups(reps: list[dict]) -> list[dict]:
    """Every engine start-up the repeats record, once (a repeat of a ``together`` sweep carries
    the one start-up its call made)."""
    seen, out = set(), []
    for r in reps:
        for u in r.get("startup", []):
            key = (u.get("start_s"), u.get("free_before"), u.get("free_after"))
            if key not in seen:
                seen.add(key)
                out.append(u)
    return out


def memory_check(reps: list[dict]) -> list[str]:
    """Both modes see the same memory: the static split allocated at start-up, the elastic
    pools' peak mapped together, and the device's free memory."""
    c = reps[0]["config"]
    bb, blocks = c["block_bytes"], c["blocks"]
    n = c["instances"]
    ups = startups(reps)
    lines = ["## Memory both modes see", "",
             f"KV total {gib(c['budget_bytes'])} GiB: static {n} x {blocks['static']} "
             f"blocks of {bb / 2**20:.2f} MiB = {gib(n * blocks['static'] * bb)} GiB "
             f"allocated at start-up; elastic {n} pools of {blocks['elastic']} blocks "
             "(virtual) whose maps are charged to one shared budget of "
             f"{gib(c['budget_bytes'])} GiB."]
    for u in ups[:4]:
        lines.append(f"* start-up of {' + '.join(u['modes'])} ({u['start_s']} s): device free "
                     f"{gib(u['free_before'])} -> {gib(u['free_after'])} GiB.")
    for m in c["modes"]:
        fm = [r["runs"][k]["free_min"] for r in reps for k in r["runs"]
              if k.endswith("/" + m) and r["runs"][k].get("free_min") is not None]
        fs = [r["runs"][k]["free_start"] for r in reps for k in r["runs"]
              if k.endswith("/" + m) and r["runs"][k].get("free_start") is not None]
        if fm and fs:
            lines.append(f"* {m} points: device free at their start {gib(min(fs))}-"
                         f"{gib(max(fs))} GiB, lowest during them {gib(min(fm))} GiB.")
    for m in [m for m in c["modes"] if m != "static"]:
        mp = [r["runs"][k].get("mapped_peak_bytes") or 0 for r in reps for k in r["runs"]
              if k.endswith("/" + m)]
        if any(mp):
            lines.append(f"* {m}: most mapped together {gib(max(mp))} GiB (budget "
                         f"{gib(c['budget_bytes'])} GiB).")
    for u in [u for u in ups if u.get("kvcached")][:3]:
        b = u["kvcached"]["ballast"]
        lines.append(f"* kvcached's ballast: device free {gib(b['free_before'])} GiB with its "
                     f"engines up, {gib(b['held'])} GiB held so that its 5 % headroom rule "
                     f"leaves it {gib(b['kvcached_may_map'])} GiB (a card that leaves it "
                     "less runs no kvcached point, and says why).")
    return lines + [""]


def _q(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def map_cost_summary(reps: list[dict]) -> dict[str, dict | None]:
    """Per elastic mode: p50, p99 and count of its per-page grow and shrink costs (us) over
    every point of every repeat; None for a mode whose points measured none."""
    out: dict[str, dict | None] = {}
    for m in [m for m in reps[0]["config"]["modes"] if m != "static"]:
        runs = [run for r in reps for key, run in r["runs"].items() if key.endswith("/" + m)
                and run.get("map_costs") is not None]
        if not runs:
            out[m] = None
            continue
        out[m] = {}
        for k in ("grow", "shrink"):
            v = [x for run in runs for x in run["map_costs"].get(k, [])]
            out[m][k] = {"p50": _q(v, 0.5), "p99": _q(v, 0.99), "n": len(v)} if v else \
                {"p50": None, "p99": None, "n": 0}
    return out


def map_cost_lines(reps: list[dict]) -> list[str]:
    """The per-page map cost of each elastic implementation, as the sweep measured it (p50 /
    p99 over every point and repeat), and why a mode without one has none."""
    lines = ["## Per-page map cost", "",
             "us per page, p50 / p99 (count) over every point of every repeat: kvcached's from "
             "its own log at INFO (grow: each batch its prealloc thread mapped ahead, checks and "
             "locks included; a map on the allocating thread logs only at DEBUG; shrink: each "
             "batch unmapped).", "", "| mode | grow p50 / p99 | shrink p50 / p99 |",
             "|---|---|---|"]
    for m, got in map_cost_summary(reps).items():
        if got is None:
            lines.append(f"| {m} | not measured by this sweep | not measured by this sweep |")
            continue
        lines.append(f"| {m} | " + " | ".join(
            f"{v['p50']:,.0f} / {v['p99']:,.0f} ({v['n']})" if v["n"] else "none logged"
            for v in got.values()) + " |")
    return lines + [""]


def not_run_of(reps: list[dict]) -> dict[str, dict]:
    """Each mode that did not run, with its error in its own words (the first call's)."""
    seen: dict[str, dict] = {}
    for r in reps:
        for m, why in (r.get("not_run") or {}).items():
            seen.setdefault(m, why)
    return seen


def not_run_lines(reps: list[dict]) -> list[str]:
    seen = not_run_of(reps)
    if not seen:
        return []
    lines = ["## Modes that did not run", ""]
    for m, why in seen.items():
        lines.append(f"* {m} (repeat {why.get('repeat', '?')}): {why['reason']}")
    return lines + [""]


def _prediction(reps: list[dict]) -> tuple[dict, list[str]] | None:
    """The simulator's answer for this sweep (a fitted step profile, judged on the repeats it
    was not fitted on): its counts for the record and its section for the report."""
    pred = sim_beside_real(reps)
    if pred is None:
        return None
    keep = {k: pred[k] for k in ("profile", "points", "p50_ok", "p99_ok", "both_ok",
                                 "held_out_points", "held_out_both_ok", "tolerance")}
    return keep, ["## The simulator beside this sweep", "", prediction_markdown(pred), ""]


def from_repeats(reps: list[dict], backend: str) -> ColocationRun:
    """The lab's run from repeat files; the backend is the one they ran on (read back on
    another machine, the record still says where the sweep ran)."""
    c = reps[0]["config"]
    backend = "host" if c["device"] == "cpu" else "gpu"
    peaks = sorted(c["peaks"])
    modes = list(c["modes"])
    overall = {(p, m): [r["runs"][f"{p}/{m}"]["overall"] for r in reps
                        if f"{p}/{m}" in r["runs"]] for p in peaks for m in modes}
    overall = {k: v for k, v in overall.items() if v}
    peaks = [p for p in peaks if any((p, m) in overall for m in modes)]
    footer: list[str] = []
    low = peaks[0] if peaks else None
    for m in [m for m in modes if m != "static"]:
        if low is None or (low, "static") not in overall or (low, m) not in overall:
            continue
        s, e = overall[(low, "static")], overall[(low, m)]
        ratio = spread([b["ttft"]["mean"] / a["ttft"]["mean"] for a, b in zip(s, e,
                                                                              strict=False)])
        footer += [f"Low load (PEAK {low}): {m}/static mean TTFT {_sp(ratio)} (median "
                   "[min-max] over repeats).", ""]
    pred = _prediction(reps)
    footer += not_run_lines(reps) + memory_check(reps) + per_instance(reps, peaks, modes) + \
        where_time_went(reps, peaks, modes) + \
        (map_cost_lines(reps) if len(modes) > 2 else []) + (pred[1] if pred else [])
    ver = next((r.get("vllm_version") for r in reps if r.get("vllm_version")), None)
    graphs = all(f["cuda_graphs"] and not f.get("eager", True) for r in reps
                 for u in r.get("startup", []) for f in u["engines"].values())
    scale = c["time_scale"]
    own = c.get("setting") == "kvcached"
    out_len = max(2, round(c["completion_len"] / scale))
    third = ("; kvcached: stock vLLM under kvcached 0.1.6's autopatch, capped at that total by a "
             "ballast" if "kvcached" in modes else "")
    trace = (f"kvcached's trace as its script sends it (no time scaling), prompts "
             f"{c['prompt_len']}, completions {out_len} tokens, the KV total its A100-80G run "
             "left beside three weight sets. PEAK in req/s" if own else
             f"kvcached's ramp time-compressed x{scale:g}, prompts {c['prompt_len']}, "
             f"completions {out_len} tokens. PEAK (x scale = req/s)")
    setup = [f"{c['instances']} vLLM {ver or '?'} servers, one process each, of the {c['model']} "
             f"shape with random weights (load_format dummy), prompts by token id; KV "
             f"{gib(c['budget_bytes'])} GiB in all (static: a third each through "
             "num_gpu_blocks_override; elastic: autopatch, one shared GPU budget of that "
             f"total{third}). {trace}; TTFT in ms, as the "
             f"streaming client saw it. {'Decode in CUDA graphs' if graphs else 'Eager'} in "
             f"{'every mode' if len(modes) > 2 else 'both modes'}; prefix caching off. "
             + ("Both modes stayed up for the whole call" if c["together"] else
                "Fresh engines per repeat and mode")
             + f"; PEAKs in the order {', '.join(map(str, c['peaks']))}; {len(reps)} repeat(s), "
             "mode orders: " + "; ".join(f"{r['repeat']}: {' then '.join(r['order'])}"
                                         for r in reps) + ".", ""]
    return ColocationRun(
        backend=backend, peaks=peaks, overall=overall, time_scale=None if own else scale,
        title=f"Colocation on {reps[0]['device']}: {c['instances']} x {c['model']} (real vLLM)",
        setup=setup, footer=footer, record=_record_fields(reps, backend, ver, graphs),
        results={"config": c, "device": reps[0]["device"], "vllm_version": ver,
                 "provenance": {**(reps[0].get("provenance") or {}),
                                "report_command": command_line(),
                                "calls": sorted({(r.get("provenance") or {}).get("date", "?")
                                                 for r in reps})},
                 "startup": startups(reps)[:6], "prediction": pred[0] if pred else None,
                 **({"map_costs_us": map_cost_summary(reps), "not_run": not_run_of(reps)}
                    if "kvcached" in modes else {}),
                 "repeats": [{"repeat": r["repeat"], "order": r["order"],
                              "runs": {k: {kk: vv for kk, vv in v.items()
                                           if kk not in ("steps", "requests", "mapped_timeline",
                                                         "map_costs")}
                                       for k, v in r["runs"].items()}} for r in reps]})


def _record_fields(reps: list[dict], backend: str, ver: str | None, graphs: bool) -> dict:
    c = reps[0]["config"]
    manifest = Manifest.collect(
        backend=backend, hardware={"gpu": reps[0]["device"], "count": 1},
        engine_config={"engine": f"vLLM {ver}", "model": f"{c['model']} (random weights)",
                       "dtype": "bf16", "block_size": 32 if c["device"] == "cpu" else 16,
                       "prefix_caching": False, "max_num_seqs": c["max_num_seqs"],
                       "max_num_batched_tokens": c["max_batched_tokens"],
                       "cuda_graphs": graphs, "attention": "TRITON_ATTN"},
        kvcached_config={"gpu_budget": c["budget_bytes"],
                         "min_reserved_pages": c["min_reserved_pages"],
                         "max_reserved_pages": c["max_reserved_pages"],
                         **({f"kvcached {kvcached.VERSION}": asdict(kvcached.KvcachedSetting())}
                            if "kvcached" in c["modes"] else {})})
    prov = reps[0].get("provenance") or {}
    # the software the sweep ran on (the report may be built on another machine)
    manifest.software.update({k: prov[k] for k in ("python", "torch") if k in prov}, vllm=ver,
                             cuda=prov.get("cuda"), platform=None)
    out_len = max(2, round(c["completion_len"] / c["time_scale"]))
    return dict(
        experiment_id=f"colocation-{c['instances']}x-{c['model']}-vllm-{backend}",
        environment={"backend": backend, "engine": "vllm", "vllm_version": ver,
                     "seed": c["seed"], "peaks": list(c["peaks"]),
                     "command": f"workbench labs run colocation --backend {backend} "
                                "--param engine=vllm"},
        model_io={"model": c["model"], "input_tokens": f"{c['prompt_len']} (fixed)",
                  "output_tokens": f"{out_len} (fixed; {c['completion_len']} / time_scale)",
                  "instances": c["instances"]},
        cache_state="prefix caching off",
        load={"trace": "kvcached's ramp as its script sends it" if c.get("setting") == "kvcached"
              else "kvcached ramp, arrival times / time_scale", "time_scale": c["time_scale"],
              "budget_bytes": c["budget_bytes"], "setting": c.get("setting", "compressed"),
              "modes": list(c["modes"])},
        samples={"runs_per_point": len(reps),
                 "order": {str(r["repeat"]): r["order"] for r in reps}},
        kv={"blocks": c["blocks"], "block_bytes": c["block_bytes"]},
        correctness="not checked here (random weights); output-equality lab covers tokens",
        raw_data={"per_repeat": "repeat_<r>.json in the sweep's out_dir: runs[*].requests "
                                "([instance, arrival, ttft, e2e, output tokens]), "
                                "runs[*].steps, runs[*].mapped_timeline"},
        open_questions=["the client is one Python process streaming every request; its own "
                        "delay is inside the TTFT"],
        applicability="One device, identical random-weight models, staggered peaks, scaled ramp.",
        manifest=manifest)
