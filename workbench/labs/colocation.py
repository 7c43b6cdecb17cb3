"""The headline lab: three Llama-3.1-8B instances on one A100-80G under staggered peaks, static KV
split vs elastic KV (kvcached's "2-28x TTFT" experiment, research/kvcached.md §6.1).

Each instance gets kvcached's ramp trace (see :func:`workbench.engines.workloads.ramp_trace`):
256-token random prompts, 256-token outputs, 0 -> PEAK -> 1 req/s, then a 1 req/s tail; instance
``i`` starts ``PEAK/4 + 2*PEAK`` s after ``i-1``. Static = vLLM's fixed split at
``gpu_memory_utilization = 0.31`` each; elastic = three pools sharing the device at 0.95.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from workbench.engines.cluster import ClusterConfig, run_cluster
from workbench.engines.metrics import memory_by_instance
from workbench.engines.models import get_model
from workbench.engines.steptime import GPUS, H200_MINI_FIT, StepTimeModel
from workbench.engines.workloads import ramp_arrivals, ramp_delay, ramp_trace
from workbench.labs.record import LabRecord, Manifest

DESCRIPTION = ("3 x Llama-3.1-8B on one A100-80G, staggered ramp peaks 12..20 req/s: static "
               "split vs elastic KV; mean/p99 TTFT and speedups next to kvcached's table")
PEAKS = (12, 13, 14, 15, 16, 17, 18, 19, 20)
QUICK_PEAKS = (12, 16, 20)

# research/kvcached.md §6.1: read from the published SVG (bar heights approximate), ms.
KVCACHED = {
    "mean_elastic": dict(zip(PEAKS, (98, 106, 118, 129, 135, 211, 518, 1222, 2027), strict=True)),
    "mean_static": dict(zip(PEAKS, (94, 100, 111, 328, 839, 1599, 2379, 3165, 4026), strict=True)),
    "mean_speedup": dict(zip(PEAKS, (1.0, 0.9, 0.9, 2.5, 6.2, 7.6, 4.6, 2.6, 2.0), strict=True)),
    "p99_elastic": dict(zip(PEAKS, (211, 221, 260, 297, 322, 1555, 4548, 8877, 12310),
                            strict=True)),
    "p99_static": dict(zip(PEAKS, (194, 193, 243, 5184, 9086, 12159, 13489, 14610, 15267),
                           strict=True)),
    "p99_speedup": dict(zip(PEAKS, (0.9, 0.9, 0.9, 17.4, 28.2, 7.8, 3.0, 1.6, 1.2), strict=True)),
}


# Step-time what-ifs. "kvcached-fit": slower steps (HBM at 55% of peak, 5 ms host overhead per
# step) chosen by hand so the static knee lands at PEAK 15 as in the published table; a fit to
# that table, not a measurement of vLLM.
CALIBRATIONS: dict[str, dict[str, float]] = {
    "roofline": {},
    "kvcached-fit": {"bw_eff": 0.55, "step_overhead_s": 0.005},
    # measured: the mini engine on an H200 (engines/steptime.py H200_MINI_FIT), a what-if here
    "mini-h200": dict(H200_MINI_FIT),
}


def run_point(peak: int, mode: str, seed: int = 0, timeline_every_s: float = 1.0,
              steptime: dict | None = None) -> dict:
    """One simulation: every instance's workload at ``peak``; a picklable summary.

    ``steptime`` overrides :class:`StepTimeModel` fields (calibration what-ifs)."""
    cfg = ClusterConfig(mode=mode, seed=seed, steptime=dict(steptime or {}))
    wl = [ramp_trace(peak, i, seed=seed) for i in range(cfg.num_instances)]
    res = run_cluster(cfg, wl)
    o = res.overall
    mem = memory_by_instance(s for s in res.memory
                             if abs(s.t / timeline_every_s - round(s.t / timeline_every_s)) < 1e-9)
    inst = []
    for r in res.instances:
        timeline = mem.get(r.name, {"mapped_bytes": [0]})
        peak_mapped = max(timeline["mapped_bytes"]) if r.held_bytes is None else r.held_bytes
        inst.append({"name": r.name, "summary": r.summary.as_dict(), "stats": r.stats,
                     "kv_capacity_tokens": r.kv_capacity_tokens, "held_bytes": r.held_bytes,
                     "peak_mapped_bytes": peak_mapped, "steps": r.steps, "vmm_s": r.vmm_s})
    return {"peak": peak, "mode": mode, "overall": o.as_dict(), "instances": inst,
            "timeline": mem, "sim_s": res.sim_s, "wall_s": res.wall_s, "cpu_s": res.cpu_s}


def _ms(x: float) -> float:
    return round(x * 1e3, 1)


def _require_cuda() -> None:
    from workbench.errors import ConfigError

    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise ConfigError("backend 'gpu'", "no CUDA GPU (with torch) is visible here",
                          "run on a CUDA host, or use --backend sim")


def run(peaks: Sequence[int] = PEAKS, *, seed: int = 0, workers: int | None = None,
        progress: Callable[[int, int, str], None] | None = None, backend: str = "sim",
        quick: bool = False, steptime: dict | str | None = None) -> tuple[LabRecord, str]:
    """Run the sweep; returns the record and its Markdown report.

    ``steptime``: :class:`StepTimeModel` overrides, or a name from :data:`CALIBRATIONS`."""
    if isinstance(steptime, str):
        if steptime not in CALIBRATIONS:
            from workbench.errors import ConfigError

            raise ConfigError(f"steptime {steptime!r}", "is not a known calibration",
                              f"use one of {', '.join(CALIBRATIONS)} or key=value pairs")
        steptime = CALIBRATIONS[steptime]
    if backend == "gpu":  # three mini engines on one real GPU (workbench.mini)
        _require_cuda()
        from workbench.mini.colocation import run_lab

        return run_lab(None if peaks is PEAKS else peaks, seed=seed, quick=quick,
                       progress=progress)
    if backend != "sim":
        from workbench.errors import ConfigError

        raise ConfigError(f"backend {backend!r}", "the colocation lab runs on sim or gpu",
                          "use --backend sim, or --backend gpu on a CUDA host")
    if quick:
        peaks = [p for p in peaks if p in QUICK_PEAKS] or list(QUICK_PEAKS)
    jobs = [(p, m) for p in peaks for m in ("static", "elastic")]
    workers = workers or min(len(jobs), max(1, min(2, os.cpu_count() or 1)))
    out: dict[tuple[int, str], dict] = {}
    if workers == 1:
        for i, (p, m) in enumerate(jobs):
            out[(p, m)] = run_point(p, m, seed, steptime=steptime)
            if progress:
                progress(i + 1, len(jobs), f"PEAK {p} {m}")
    else:
        with ProcessPoolExecutor(workers) as ex:
            futs = {ex.submit(run_point, p, m, seed, 1.0, steptime): (p, m) for p, m in jobs}
            from concurrent.futures import as_completed

            for i, f in enumerate(as_completed(futs)):
                p, m = futs[f]
                out[(p, m)] = f.result()
                if progress:
                    progress(i + 1, len(jobs), f"PEAK {p} {m}")
    points = []
    for p in peaks:
        s, e = out[(p, "static")]["overall"], out[(p, "elastic")]["overall"]
        points.append({
            "peak": p,
            "mean_ttft_ms": {"static": _ms(s["ttft"]["mean"]), "elastic": _ms(e["ttft"]["mean"])},
            "p99_ttft_ms": {"static": _ms(s["ttft"]["p99"]), "elastic": _ms(e["ttft"]["p99"])},
            "mean_speedup": round(s["ttft"]["mean"] / e["ttft"]["mean"], 2),
            "p99_speedup": round(s["ttft"]["p99"] / e["ttft"]["p99"], 2),
            "tpot_ms": {"static": _ms(s["tpot"]["mean"]), "elastic": _ms(e["tpot"]["mean"])},
            "preemptions": {"static": s["preemptions"], "elastic": e["preemptions"]},
            "kvcached": {k: KVCACHED[k].get(p) for k in KVCACHED},
        })
    sim_s = sum(v["sim_s"] for v in out.values())
    cpu_s = sum(v["cpu_s"] for v in out.values())
    record = _record(points, out, peaks, seed, sim_s, cpu_s, steptime)
    return record, markdown(points, sim_s, cpu_s, steptime)


def _record(points: list[dict], out: dict, peaks: Sequence[int], seed: int, sim_s: float,
            cpu_s: float, steptime: dict | None) -> LabRecord:
    model = get_model("llama-3.1-8b")
    cfg = ClusterConfig(steptime=dict(steptime or {}))
    st = StepTimeModel.preset(model, cfg.gpu, **cfg.steptime)
    all_static = [out[(p, "static")]["overall"] for p in peaks]
    all_elastic = [out[(p, "elastic")]["overall"] for p in peaks]

    def dist(key: str, rows: list[dict]) -> dict:
        return {str(p): r[key] for p, r in zip(peaks, rows, strict=True)}

    manifest = Manifest.collect(
        hardware={"gpu": f"simulated {GPUS[cfg.gpu].name}", "count": 1,
                  "vram_bytes": GPUS[cfg.gpu].memory_bytes, "driver": None,
                  "vmm_latency_preset": cfg.gpu},
        engine_config={"engine": "vllm-like (workbench.engines, V1-style)",
                       "model": model.name, "revision": None, "dtype": "bf16",
                       "kv_dtype": "bf16", "attention_backend": "roofline model", "tp": 1,
                       "pp": 1, "block_size": 16, "prefix_caching": False,
                       "max_num_batched_tokens": cfg.vllm.max_num_batched_tokens,
                       "max_num_seqs": cfg.vllm.max_num_seqs, "chunked_prefill": True,
                       "async_scheduling": False, "sleep_mode": None,
                       "static_gpu_memory_utilization": cfg.gpu_memory_utilization,
                       "activation_bytes": cfg.activation_bytes,
                       "steptime": {"flops_eff": st.flops_eff, "bw_eff": st.bw_eff,
                                    "step_overhead_s": st.step_overhead_s,
                                    "seq_overhead_s": st.seq_overhead_s}},
        kvcached_config={"ipc_name": None, "page_size": cfg.pool.page_size,
                         "contiguous_layout": cfg.pool.contiguous_layout,
                         "prealloc": cfg.pool.prealloc,
                         "min_reserved_pages": cfg.pool.min_reserved_pages,
                         "max_reserved_pages": cfg.pool.max_reserved_pages,
                         "max_cached_tokens": cfg.pool.max_cached_tokens,
                         "memory_limit": None, "gpu_utilization": cfg.kv_gpu_utilization})
    return LabRecord(
        experiment_id="colocation-3x-llama3.1-8b-a100",
        hypothesis="Sharing KV memory elastically between three co-located instances lowers TTFT "
                   "when one instance peaks while the others idle, at a small cost at low load.",
        environment={"backend": "sim", "seed": seed, "peaks": list(peaks),
                     "steptime_overrides": cfg.steptime,
                     "command": "workbench labs run colocation --backend sim"},
        model_io={"model": model.name, "input_tokens": "256 (fixed)",
                  "output_tokens": "256 (fixed, no early stop)", "instances": 3},
        cache_state="prefix caching off (as in the bench: --no-enable-prefix-caching)",
        load={"trace": "kvcached ramp: 0->PEAK->1 req/s then 1 req/s tail of (3-i)*delay",
              "delay_s": {str(p): ramp_delay(p) for p in peaks},
              "requests_per_point": {str(p): sum(len(ramp_arrivals(p, i)) for i in range(3))
                                     for p in peaks},
              "actual_send_rate": "exact (open loop, simulated client)"},
        samples={"runs_per_point": 1, "order": "independent processes, deterministic seed",
                 "note": "one simulated run per point; the simulator is deterministic"},
        outcomes={"static": dist("finished", all_static), "elastic": dist("finished", all_elastic),
                  "rejected": {"static": sum(r["rejected"] for r in all_static),
                               "elastic": sum(r["rejected"] for r in all_elastic)}},
        ttft={"static": dist("ttft", all_static), "elastic": dist("ttft", all_elastic)},
        tpot_itl={"tpot_static": dist("tpot", all_static),
                  "tpot_elastic": dist("tpot", all_elastic),
                  "itl_static": dist("itl", all_static), "itl_elastic": dist("itl", all_elastic)},
        e2e={"static": dist("e2e", all_static), "elastic": dist("e2e", all_elastic)},
        throughput={m: {str(p): {k: out[(p, m)]["overall"][k] for k in
                                 ("req_per_s", "input_tok_per_s", "output_tok_per_s")}
                        for p in peaks} for m in ("static", "elastic")},
        slo_goodput={"slo": cfg.slo.describe(),
                     "goodput_req_per_s": {m: {str(p): out[(p, m)]["overall"]["goodput_req_per_s"]
                                               for p in peaks} for m in ("static", "elastic")}},
        hits={"local": 0, "external": None, "denominator": "prefix caching off"},
        transfer_bytes=None, phase_times=None,
        kv={m: {str(p): {"preemptions": out[(p, m)]["overall"]["preemptions"],
                         "instances": [{k: i[k] for k in ("name", "kv_capacity_tokens",
                                                          "peak_mapped_bytes", "vmm_s", "stats")}
                                       for i in out[(p, m)]["instances"]]}
                for p in peaks} for m in ("static", "elastic")},
        correctness=None,
        raw_data={"timelines": "results.timelines (mapped/reserved bytes per instance, 1 s)"},
        verdict=_verdict(points),
        mechanism="Static splits cap each instance at ~62k KV tokens; at its peak an instance "
                  "preempts (recompute) and queues, so TTFT explodes. Elastic pools let the "
                  "peaking instance map the pages the idle ones do not use.",
        open_questions=["Step-time model is uncalibrated (roofline + guessed overheads); the "
                        "knee's PEAK depends on it", "GPU time-slicing modelled at step "
                        "granularity", "API-server/tokenizer latency not modelled"],
        applicability="One GPU, three identical 8B models, staggered non-overlapping peaks, "
                      "256/256 tokens; not a fixed speedup for other setups (seed 000 §14.3).",
        manifest=manifest,
        results={"points": points, "kvcached_published": {k: {str(p): v for p, v in d.items()}
                                                          for k, d in KVCACHED.items()},
                 "sim_s": sim_s, "cpu_s": cpu_s,
                 "sim_s_per_cpu_s": sim_s / cpu_s if cpu_s else None,
                 "timelines": {f"{p}/{m}": out[(p, m)]["timeline"] for p in peaks
                               for m in ("static", "elastic")}})


def _verdict(points: list[dict]) -> str:
    best_mean = max(points, key=lambda r: r["mean_speedup"])
    best_p99 = max(points, key=lambda r: r["p99_speedup"])
    low = points[0]
    return (f"Supported in simulation: mean TTFT speedup up to {best_mean['mean_speedup']}x "
            f"(PEAK {best_mean['peak']}), p99 up to {best_p99['p99_speedup']}x (PEAK "
            f"{best_p99['peak']}); at PEAK {low['peak']} {low['mean_speedup']}x.")


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.0f}" if isinstance(x, (int, float)) and abs(x) >= 10 else f"{x}"


def markdown(points: list[dict], sim_s: float, cpu_s: float,
             steptime: dict | None = None) -> str:
    cal = ", ".join(f"{k}={v}" for k, v in (steptime or {}).items()) or "roofline defaults"
    lines = [
        "# Colocation lab: 3 x Llama-3.1-8B on one A100-80G (simulated)", "",
        f"Step-time model: {cal}.", "",
        "Static split (gpu_memory_utilization 0.31 each) vs elastic KV (shared pages, "
        "gpu_utilization 0.95). TTFT in ms. *kvcached* columns: the published table "
        "(research/kvcached.md §6.1, read from bar heights, approximate).", "",
    ]
    for title, stat in (("Mean TTFT", "mean"), ("P99 TTFT", "p99")):
        lines += [f"## {title}", "",
                  "| PEAK | ours static | ours elastic | ours speedup | kvcached static | "
                  "kvcached elastic | kvcached speedup |", "|---|---|---|---|---|---|---|"]
        for r in points:
            ours, k = r[f"{stat}_ttft_ms"], r["kvcached"]
            lines.append(f"| {r['peak']} | {_fmt(ours['static'])} | {_fmt(ours['elastic'])} | "
                         f"{r[f'{stat}_speedup']}x | {_fmt(k[f'{stat}_static'])} | "
                         f"{_fmt(k[f'{stat}_elastic'])} | {k[f'{stat}_speedup']}x |")
        lines.append("")
    lines += ["## Other columns", "",
              "| PEAK | TPOT static / elastic (ms) | preemptions static / elastic |",
              "|---|---|---|"]
    for r in points:
        lines.append(f"| {r['peak']} | {r['tpot_ms']['static']} / {r['tpot_ms']['elastic']} | "
                     f"{r['preemptions']['static']} / {r['preemptions']['elastic']} |")
    lines += ["", f"Simulated {sim_s:,.0f} s (three instances each) in {cpu_s:,.1f} s of CPU "
                  f"time ({sim_s / cpu_s:,.0f} simulated s per CPU s).", "", EXPLANATIONS]
    return "\n".join(lines) + "\n"


EXPLANATIONS = """## Why ours differs from kvcached's table

* **Where the knee is.** The static baseline degrades once an instance's in-flight KV passes its
  split (~62k tokens here). How soon that happens depends on decode speed: slower steps keep more
  requests in flight. Our step time is an uncalibrated roofline (A100 2.04 TB/s at 80%, 312 TFLOP/s
  at 60%, 2.5 ms + 15 us/seq host overhead), and the real vLLM 0.9.2 steps were evidently slower,
  so with the roofline defaults our static knee sits at a higher PEAK than kvcached's (15).
  ``--steptime kvcached-fit`` (HBM at 55% of peak, 5 ms per step; a hand fit to this table, not
  a measurement) moves it to PEAK 15. Calibrating against measured step times is the real fix.
* **Absolute TTFT at low load.** Ours counts queueing + scheduling + prefill only. The bench
  measured at the HTTP client: API server, tokenisation, detokenisation and streaming add tens of
  ms, so kvcached's ~95 ms floor is above ours.
* **Elastic vs static at low load (kvcached ~0.9x).** Elastic pays VMM latency only when its
  5-page reserve runs dry (a100 preset: create 193 us per 2 MiB, i.e. ~12 ms per 128 MiB compound
  page); the background refill hides most of it, so our low-load ratio is close to 1.0. The real
  system also pays IPC round trips to the worker on every map, which we do not model.
* **Elastic at the highest PEAKs.** kvcached's elastic TTFT rises from PEAK 17 (p99 4.5-12 s): at
  those rates the GPU's compute is the bottleneck, not memory. Ours rises later for the same step-
  time reason as the knee.
* **How bad static gets past the knee.** Ours stays below kvcached's static TTFT (about 3x lower
  mean). A preempted request here costs only its recompute (a prefill of at most 512 tokens) and
  queueing in the engine; API-server and client queueing and CPU contention between three engine
  processes are not modelled.
* **Static split size.** The bench's baseline configuration is not in the repository; we assume
  gpu_memory_utilization 0.31 with 2.2 GiB of activations/graphs, which makes the split hold ~62k
  tokens (consistent with its --max-model-len 62000).
* **Compute sharing.** Instances time-slice the GPU at step granularity; a real GPU interleaves
  kernels from three contexts with context-switch costs we do not charge.
"""
