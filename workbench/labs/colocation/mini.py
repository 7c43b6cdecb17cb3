"""The colocation lab's ``mini`` runner (``gpu``/``host``): run the sweep (or read its per-repeat
JSON back, :func:`~workbench.labs.colocation.params.load_repeats`), then hand the lab its
summaries, the setup text, the footer that says where the time went, and the record fields only
this backend knows. The engines, the budget and the sweep itself are
:mod:`workbench.mini.colocation`."""

from __future__ import annotations

from workbench.backends import capabilities
from workbench.labs.colocation.params import (
    ColocationParams,
    ColocationRun,
    load_repeats,
    reading_sweep,
    spread,
)
from workbench.labs.kit.base import Progress
from workbench.labs.kit.record import Manifest
from workbench.mini.colocation import ColoConfig, run
from workbench.units import GiB


def _decode(reps: list[dict]) -> str:
    """How the decode ran (sweeps written before graphs existed carry no flag: eager)."""
    return ("decode in CUDA graphs" if reps[0].get("cuda_graphs", False)
            else "eager PyTorch decode (no CUDA graphs)")


def config_for(params: ColocationParams, backend: str) -> ColoConfig:
    host = not capabilities(backend).cuda  # the same sweep on the CPU, a smoke run
    cfg = ColoConfig(model=params.model or ("tiny" if host else "llama-3.1-8b"),
                     budget_gib=params.budget_gib, time_scale=params.time_scale,
                     prompt_len=params.prompt_len, completion_len=params.completion_len,
                     seed=params.seed, device="cpu" if host else "cuda",
                     repeats=max(1, params.repeats), first_repeat=params.first_repeat,
                     out_dir=params.out_dir, mapper=params.mapper,
                     cuda_graphs=params.cuda_graphs)
    if params.mapper:  # the background mapper keeps 1 page id mapped ahead; no more is parked
        cfg.min_reserved_pages, cfg.max_reserved_pages = 1, 1
    if params.peaks:
        cfg.peaks = tuple(params.peaks)
    if params.quick:
        cfg.peaks = cfg.peaks[:2]
    return cfg


def run_mini(params: ColocationParams, backend: str,
             progress: Progress | None = None) -> ColocationRun:
    """The lab's ``gpu`` (CUDA) and ``host`` (CPU) backends: mini engines, real time."""
    if params.from_dir:
        reps = load_repeats(params.from_dir)
        with reading_sweep(f"from_dir={params.from_dir!r}"):
            return from_repeats(reps, backend)
    else:
        cfg = config_for(params, backend)
        done = [0]
        total = len(cfg.peaks) * len(cfg.modes) * cfg.repeats

        def log(msg: str) -> None:
            done[0] += 1
            if progress is not None:
                progress(done[0], total, msg.split(":")[0])

        if progress is not None:  # the models build before the first run: say so first
            progress(0, total, "building the models (about a minute on a CPU)")
        reps = run(cfg, log=log)
    return from_repeats(reps, backend)


def from_repeats(reps: list[dict], backend: str) -> ColocationRun:
    c = reps[0]["config"]
    peaks = sorted(c["peaks"])  # tables low to high load, whatever order they ran in
    modes = c["modes"]
    overall = {(p, m): [r["runs"][f"{p}/{m}"]["overall"] for r in reps
                        if f"{p}/{m}" in r["runs"]] for p in peaks for m in modes}
    overall = {k: v for k, v in overall.items() if v}
    low = peaks[0]
    footer: list[str] = []
    lo = None
    if overall.get((low, "static")) and overall.get((low, "elastic")):
        s, e = overall[(low, "static")], overall[(low, "elastic")]
        n = min(len(s), len(e))
        lo = {"peak": low,
              "mean_ttft_elastic_over_static": spread(
                  [e[i]["ttft"]["mean"] / s[i]["ttft"]["mean"] for i in range(n)]),
              "tpot_elastic_over_static": spread(
                  [e[i]["tpot"]["mean"] / s[i]["tpot"]["mean"] for i in range(n)])}
        # the lowest PEAK is the low-load reading only when it has a higher one beside it
        where = "Low load" if len(peaks) > 1 else "The one PEAK run"
        footer = [f"{where} (PEAK {low}): elastic/static mean TTFT "
                  f"{_sp(lo['mean_ttft_elastic_over_static'])}, TPOT "
                  f"{_sp(lo['tpot_elastic_over_static'])} (median [min-max] over repeats).", ""]
    footer += where_time_went(reps, peaks) + slow_steps_text(reps)
    scale = c["time_scale"]
    out_len = max(2, round(c["completion_len"] / scale))
    mapper = ("background mapper, reserve 1 page id" if c.get("mapper", False)
              else "inline maps on the engine thread, reserve 0..1 page ids")
    return ColocationRun(
        backend=backend, peaks=peaks, overall=overall, time_scale=scale,
        title=f"Colocation on {reps[0]['device']}: {c['instances']} x {c['model']} (mini engine)",
        setup=[f"KV budget {c['budget_gib']} GiB in all (static: "
               f"{c['budget_gib'] / c['instances']:.2f} GiB each; elastic: {mapper}); ramp "
               f"time-compressed x{scale}, prompts {c['prompt_len']}, completions {out_len} "
               f"tokens. PEAK (x scale = req/s); TTFT in ms. {_decode(reps)}. "
               f"PEAKs run in the order {', '.join(map(str, c['peaks']))}; "
               f"{len(reps)} repeat(s), mode orders: "
               + "; ".join(f"{r['repeat']}: {' then '.join(r['order'])}" for r in reps) + ".",
               ""],
        footer=footer, record=_record_fields(reps, backend),
        results={"config": c, "device": reps[0]["device"], "low_load_overhead": lo,
                 "repeats": [{"repeat": r["repeat"], "order": r["order"],
                              "runs": {k: {kk: vv for kk, vv in v.items()
                                           if kk not in ("steps", "requests")}
                                       for k, v in r["runs"].items()}} for r in reps]})


def slow_steps_text(reps: list[dict]) -> list[str]:
    """The steps of every run that took over 0.3 s (one-off costs on the request path: a kernel
    compiled or a plan built for a new shape), with their kind; sweeps recorded before runs kept
    them say nothing."""
    runs = [(r["repeat"], k, v) for r in reps for k, v in r["runs"].items() if "slow_steps" in v]
    if not runs:
        return []
    slow = [(rep, k, s) for rep, k, v in runs for s in v["slow_steps"]]
    longest = max(runs, key=lambda x: x[2]["max_step_s"])
    lines = ["## One-off steps", "", f"Steps over 0.3 s: {len(slow)} in {len(runs)} runs "
             f"(longest step of any run {longest[2]['max_step_s'] * 1e3:,.0f} ms, repeat "
             f"{longest[0]} {longest[1]}); Triton compiles during runs: "
             f"{sum(len(v.get('compiles', ())) for _, _, v in runs)}."]
    lines += [f"* repeat {rep} {k}: engine {s[0]} at {s[1]} s, {s[2] * 1e3:,.0f} ms, {s[3]}"
              for rep, k, s in slow[:10]]
    return lines + [""]


def _sp(sp: dict) -> str:
    return f"{sp['median']:.3f} [{sp['min']:.3f}-{sp['max']:.3f}]"


def run_diagnostics(r: dict) -> dict:
    """Where one run's time went: preemptions, engine-thread vs mapper VMM calls, allocs,
    step time, the KV it held."""
    vmm = r.get("vmm") or {"calls": {}}
    by = {who: (sum(c[0] for c in ops.values()), sum(c[1] for c in ops.values()),
                sum(c[2] for c in ops.values())) for who, ops in vmm["calls"].items()}
    steps = r["steps"]
    return {"preemptions": sum(r["preemptions"]),
            "engine_vmm_calls": by.get("engine", (0, 0.0, 0.0))[0],
            "engine_vmm_s": by.get("engine", (0, 0.0, 0.0))[1]
            + by.get("engine", (0, 0.0, 0.0))[2],
            "mapper_vmm_calls": by.get("mapper", (0, 0.0, 0.0))[0],
            "alloc_s": sum(a[1] for a in r["alloc_calls"]),
            "steps": len(steps), "step_s": sum(s[5] for s in steps),
            "refused_creates": vmm.get("refused_creates", 0),
            "peak_kv_gib": (r["budget_peak_bytes"] or 0) / GiB,
            "wall_s": r["wall_s"]}


def per_instance(r: dict) -> dict[str, list[float]]:
    """One run, per instance: mean TTFT (ms), preemptions, and the KV it had mapped while the
    last instance had requests waiting (GiB, mean over those timeline samples; 0 for static
    engines or when the last instance never queued). Timeline rows: [t, used x n, mapped x n,
    waiting x n, running x n]."""
    n = len(r["preemptions"])
    ttft = [[q[2] for q in r["requests"] if q[0] == k] for k in range(n)]
    rows = [row for row in r["timeline"] if row[1 + 3 * n - 1] > 0] if r.get("vmm") else []
    mapped = [sum(row[1 + n + k] for row in rows) / len(rows) / GiB if rows else 0.0
              for k in range(n)]
    return {"ttft_ms": [1e3 * sum(t) / len(t) if t else 0.0 for t in ttft],
            "preemptions": [float(x) for x in r["preemptions"]], "queued_mapped_gib": mapped}


def where_time_went(reps: list[dict], peaks: list[int]) -> list[str]:
    cols = ("preemptions", "steps", "step_s", "wall_s", "alloc_s", "engine_vmm_calls",
            "engine_vmm_s", "mapper_vmm_calls", "refused_creates", "peak_kv_gib")
    lines = ["## Where the time went (median over repeats)", "",
             "| PEAK | mode | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for p in peaks:
        for m in ("static", "elastic"):
            ds = [run_diagnostics(r["runs"][f"{p}/{m}"]) for r in reps if f"{p}/{m}" in r["runs"]]
            if not ds:
                continue
            med = {k: spread([d[k] for d in ds])["median"] for k in cols}
            lines.append(f"| {p} | {m} | " + " | ".join(
                f"{med[k]:.3g}" if isinstance(med[k], float) else str(med[k]) for k in cols)
                + " |")
    lines += ["", "Per instance, 0 / 1 / 2 (instance i peaks after i-1; median over repeats): mean "
              "TTFT ms, preemptions, and the KV each had mapped while the last instance had "
              "requests waiting (elastic, GiB, mean over those samples; static holds its "
              "split).", "",
              "| PEAK | mode | mean TTFT ms | preemptions | mapped GiB while the last queued |",
              "|---|---|---|---|---|"]
    for p in peaks:
        for m in ("static", "elastic"):
            per = [per_instance(r["runs"][f"{p}/{m}"]) for r in reps if f"{p}/{m}" in r["runs"]]
            if not per:
                continue
            cols3 = [" / ".join(f"{spread([x[k][i] for x in per])['median']:.3g}"
                                for i in range(len(per[0][k])))
                     for k in ("ttft_ms", "preemptions", "queued_mapped_gib")]
            lines.append(f"| {p} | {m} | " + " | ".join(cols3) + " |")
    return lines + ["", "alloc_s: time the engine thread spent in the ledger's alloc (inline maps "
                    "and lock waits included); engine_vmm_s: its VMM calls plus its waits for "
                    "another thread's call; step_s: the steps' own wall time.", ""]


def _record_fields(reps: list[dict], backend: str) -> dict:
    c = reps[0]["config"]
    cuda = c["device"].startswith("cuda")
    vram = None
    if cuda:
        import torch

        vram = torch.cuda.get_device_properties(0).total_memory if \
            torch.cuda.is_available() else None
    manifest = Manifest.collect(
        backend=backend,
        hardware={"gpu": reps[0]["device"], "count": 1, "vram_bytes": vram, "driver": None},
        engine_config={"engine": f"workbench.mini (vLLM-like scheduler, {_decode(reps)}, "
                       "Triton paged decode)", "model": f"{c['model']} (random weights)",
                       "dtype": "bf16",
                       "kv_dtype": "bf16", "tp": 1, "pp": 1, "block_size": 16,
                       "prefix_caching": False, "max_num_batched_tokens": c["max_batched_tokens"],
                       "max_num_seqs": c["max_num_seqs"], "chunked_prefill": True,
                       "cuda_graphs": reps[0].get("cuda_graphs", False)},
        kvcached_config={"page_size": 2 << 20, "contiguous_layout": True,
                         "prealloc": c["min_reserved_pages"] > 0,
                         "background_mapper": c.get("mapper", False),
                         "min_reserved_pages": c["min_reserved_pages"],
                         "max_reserved_pages": c["max_reserved_pages"],
                         "memory_limit": int(c["budget_gib"] * GiB)})
    out_len = max(2, round(c["completion_len"] / c["time_scale"]))
    peaks = c["peaks"]
    return dict(
        experiment_id=f"colocation-{c['instances']}x-{c['model']}-{backend}",
        environment={"backend": backend, "seed": c["seed"], "peaks": list(peaks),
                     "command": f"workbench labs run colocation --backend {backend}"},
        model_io={"model": c["model"], "input_tokens": f"{c['prompt_len']} (fixed)",
                  "output_tokens": f"{out_len} (fixed; {c['completion_len']} / time_scale)",
                  "instances": c["instances"]},
        cache_state="prefix caching off",
        load={"trace": "kvcached ramp, arrival times / time_scale",
              "time_scale": c["time_scale"], "budget_gib": c["budget_gib"]},
        samples={"runs_per_point": len(reps),
                 "order": {str(r["repeat"]): r["order"] for r in reps},
                 "note": "per repeat, per PEAK, every mode in the repeat's order (even repeats "
                         "static first, odd ones elastic first); one process, models built once"},
        kv={"capacity_tokens": reps[0].get("kv_capacity_tokens"),
            "elastic_peak_mapped_bytes": {
                str(p): [r["runs"][f"{p}/elastic"]["budget_peak_bytes"] for r in reps
                         if f"{p}/elastic" in r["runs"]] for p in peaks}},
        correctness="tests/gpu/test_mini_gpu.py: VMM vs static and block vs token generations "
                    "token-for-token identical",
        raw_data={"per_repeat": "repeat_<r>.json in the sweep's out_dir: runs[*].steps "
                                "([instance, num_seqs, new_tokens, ctx_tokens, attn_pairs, "
                                "seconds, num_decode, num_prefill_tokens, t_end]), "
                                "runs[*].requests ([instance, arrival, ttft, preemptions]), "
                                "runs[*].timeline, runs[*].vmm",
                  "here": "results.repeats[*].runs (summaries, timelines, VMM calls)"},
        open_questions=[f"{_decode(reps)}: host time per step (the scheduler, eager prefill) "
                        "shares the one engine thread",
                        "one weight copy per instance but random weights: no EOS, fixed lengths"],
        applicability="One GPU, identical 8B-shaped models, staggered peaks, scaled ramp.",
        manifest=manifest)
