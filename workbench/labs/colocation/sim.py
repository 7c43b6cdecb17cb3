"""The colocation lab on the simulated backend: three Llama-3.1-8B instances on one A100-80G,
static KV split vs elastic KV (kvcached's "2-28x TTFT" experiment: docs/sources.md,
upstream-kvcached-colocation).

Each instance gets kvcached's ramp trace (see :func:`workbench.engines.sim.workloads.ramp_trace`):
256-token random prompts, 256-token outputs, 0 -> PEAK -> 1 req/s, then a 1 req/s tail; instance
``i`` starts ``PEAK/4 + 2*PEAK`` s after ``i-1``. Static = vLLM's fixed split at
``gpu_memory_utilization = 0.31`` each; elastic = three pools sharing the device at 0.95. The
points, record and Markdown are the lab's (:mod:`workbench.labs.colocation.report`).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TYPE_CHECKING

from workbench.engines.metrics import memory_by_instance
from workbench.engines.models import get_model
from workbench.engines.sim.cluster import ClusterConfig, run_cluster
from workbench.engines.sim.steptime import GPUS, StepTimeModel
from workbench.engines.sim.workloads import ramp_arrivals, ramp_delay, ramp_trace
from workbench.labs.colocation.rows import MODES, ColocationRun
from workbench.labs.kit.base import Progress
from workbench.labs.kit.kvcached import KVCACHED, PEAKS
from workbench.labs.kit.record import Manifest
from workbench.labs.kit.steptime import parse_steptime

if TYPE_CHECKING:
    from workbench.labs.colocation.params import ColocationParams

QUICK_PEAKS = (12, 16, 20)


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


def sweep(peaks: list[int], seed: int, steptime: dict, workers: int | None,
          progress: Progress | None) -> dict[tuple[int, str], dict]:
    """Every (PEAK, mode) point, in worker processes when there is more than one."""
    jobs = [(p, m) for p in peaks for m in MODES]
    workers = workers or min(len(jobs), max(1, min(2, os.cpu_count() or 1)))
    out: dict[tuple[int, str], dict] = {}
    if workers == 1:
        for i, (p, m) in enumerate(jobs):
            out[(p, m)] = run_point(p, m, seed, steptime=steptime)
            if progress:
                progress(i + 1, len(jobs), f"PEAK {p} {m}")
        return out
    with ProcessPoolExecutor(workers) as ex:
        futs = {ex.submit(run_point, p, m, seed, 1.0, steptime): (p, m) for p, m in jobs}
        for i, f in enumerate(as_completed(futs)):
            p, m = futs[f]
            out[(p, m)] = f.result()
            if progress:
                progress(i + 1, len(jobs), f"PEAK {p} {m}")
    return out


def run_sim(params: ColocationParams, progress: Progress | None = None) -> ColocationRun:
    steptime = parse_steptime(params.steptime)  # refuses a bad one before running
    peaks = list(params.peaks or PEAKS)
    if params.quick:
        peaks = [p for p in peaks if p in QUICK_PEAKS] or list(QUICK_PEAKS)
    # repeats: seeds seed, seed+1, ... (the simulator is deterministic for one seed)
    reps = [sweep(peaks, params.seed + r, steptime, params.workers, progress)
            for r in range(max(1, params.repeats))]
    out = reps[0]
    sim_s = sum(v["sim_s"] for rep in reps for v in rep.values())
    cpu_s = sum(v["cpu_s"] for rep in reps for v in rep.values())
    cal = ", ".join(f"{k}={v}" for k, v in steptime.items()) or "roofline defaults"
    return ColocationRun(
        backend="sim", peaks=peaks,
        overall={k: [rep[k]["overall"] for rep in reps] for k in out},
        title="Colocation lab: 3 x Llama-3.1-8B on one A100-80G (simulated)",
        setup=[f"Step-time model: {cal}.", "",
               "Static split (gpu_memory_utilization 0.31 each) vs elastic KV (shared pages, "
               "gpu_utilization 0.95). TTFT in ms. *kvcached* columns: the published table "
               "([kvcached's colocation benchmark]"
               "(../docs/sources.md#upstream-kvcached-colocation), read from bar heights, "
               "approximate).", "",
               EXPECTED_SHAPE, ""],
        footer=[f"Simulated {sim_s:,.0f} s (three instances each) in {cpu_s:,.1f} s of CPU "
                f"time ({sim_s / cpu_s:,.0f} simulated s per CPU s).", "", EXPLANATIONS],
        record=_record_fields(out, peaks, params.seed, steptime, len(reps)),
        results={"kvcached_published": {k: {str(p): v for p, v in d.items()}
                                        for k, d in KVCACHED.items()},
                 "sim_s": sim_s, "cpu_s": cpu_s,
                 "sim_s_per_cpu_s": sim_s / cpu_s if cpu_s else None,
                 "timelines": {f"{p}/{m}": out[(p, m)]["timeline"] for p in peaks
                               for m in MODES}})


def _manifest(cfg: ClusterConfig, st: StepTimeModel, model_name: str) -> Manifest:
    return Manifest.collect(
        hardware={"gpu": f"simulated {GPUS[cfg.gpu].name}", "count": 1,
                  "vram_bytes": GPUS[cfg.gpu].memory_bytes, "driver": None,
                  "vmm_latency_preset": cfg.gpu},
        engine_config={"engine": "vllm-like (workbench.engines.sim, V1-style)",
                       "model": model_name, "revision": None, "dtype": "bf16",
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


def _record_fields(out: dict, peaks: list[int], seed: int, steptime: dict,
                   repeats: int = 1) -> dict:
    model = get_model("llama-3.1-8b")
    cfg = ClusterConfig(steptime=dict(steptime))
    st = StepTimeModel.preset(model, cfg.gpu, **cfg.steptime)
    return dict(
        experiment_id="colocation-3x-llama3.1-8b-a100",
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
        samples={"runs_per_point": repeats, "order": "independent processes, one seed per "
                 f"repeat ({seed}..{seed + repeats - 1})",
                 "note": "the simulator is deterministic for one seed; repeats vary the seed "
                         "(prompt tokens), so their spread is the workload's, not timing noise; "
                         "kv shows the first seed's run"},
        kv={m: {str(p): {"preemptions": out[(p, m)]["overall"]["preemptions"],
                         "instances": [{k: i[k] for k in ("name", "kv_capacity_tokens",
                                                          "peak_mapped_bytes", "vmm_s", "stats")}
                                       for i in out[(p, m)]["instances"]]}
                for p in peaks} for m in MODES},
        correctness=None,
        raw_data={"timelines": "results.timelines (mapped/reserved bytes per instance, 1 s)"},
        open_questions=["Step-time model is uncalibrated (roofline + guessed overheads); the "
                        "knee's PEAK depends on it", "GPU time-slicing modelled at step "
                        "granularity", "API-server/tokenizer latency not modelled"],
        applicability="One GPU, three identical 8B models, staggered non-overlapping peaks, "
                      "256/256 tokens; not a fixed speedup for other setups (seed 000 §14.3).",
        manifest=_manifest(cfg, st, model.name))


EXPECTED_SHAPE = (
    "**Expected shape** (kvcached's table; seed 000 §14.3): at low PEAK (12-14) elastic is about "
    "as fast as static (0.9-1.0x, VMM mapping is the small cost); past the static split's knee "
    "(PEAK 15-17) static TTFT explodes while elastic stays low (mean 2.5-7.6x, p99 7.8-28x, "
    "the 28x at PEAK 16); at the highest PEAKs (18-20) the elastic instance saturates too and "
    "the gap narrows (to mean 2.0x, p99 1.2x at PEAK 20). The 2-28x belongs to this workload "
    "(three models, staggered peaks, one A100-80G), not to elastic KV in general. Compare the "
    "shape, not the absolute milliseconds.")

EXPLANATIONS = """## Why ours differs from kvcached's table

* **Where the knee is.** The static baseline degrades once an instance's in-flight KV passes its
  split (~62k tokens here). How soon that happens depends on decode speed: slower steps keep more
  requests in flight. Our step time is an uncalibrated roofline (A100 2.04 TB/s at 80%, 312 TFLOP/s
  at 60%, 2.5 ms + 15 us/seq host overhead), and the real vLLM 0.9.2 steps were evidently slower,
  so with the roofline defaults our static knee sits at a higher PEAK than kvcached's (15).
  ``--steptime kvcached-fit`` (HBM at 55% of peak, 5 ms per step; a hand fit to this table, not
  a measurement) moves it to PEAK 15 over all nine PEAKs (the quick sweep, PEAK 12/16/20, first
  sees it at 16). Calibrating against measured step times is the real fix.
* **Absolute TTFT at low load.** Ours counts queueing + scheduling + prefill only. The bench
  measured at the HTTP client: API server, tokenisation, detokenisation and streaming add tens of
  ms, so kvcached's ~95 ms floor is above ours.
* **Elastic vs static at low load (kvcached ~0.9x).** Elastic pays VMM latency only when its
  5-page reserve runs dry (a100 preset, per call: create 193 us + map 1.5 + set-access 36, so
  ~230 us per 128 MiB compound page); the background refill hides most of it, so our low-load
  ratio is close to 1.0. The real system also pays IPC round trips to the worker on every map,
  which we do not model.
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
