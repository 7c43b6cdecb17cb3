"""One PEAK of kvcached's colocation trace, no time scaling, on three Llama-3.1-8B-shaped vLLM
0.26 engines (random weights), mode by mode, each mode's engines started, served and closed in
turn: ``static`` (a third of the budget each), ``elastic`` (the workbench's pool, one budget
shared), ``kvcached`` (kvcached 0.1.6's own autopatch, capped at the budget by a ballast). The
budget is what kvcached's A100-80G run left beside three weight sets
(workbench.engines.real.kvcached_budget). On the GPU machine, after gpu/vllm26/env.sh and
gpu/kvcached/env.sh (gpu/kvcached/smoke.sh does both):

    python gpu/kvcached/smoke.py OUT [--peak 4] [--modes static,elastic,kvcached]

Writes OUT/result.json (per mode: mean and p99 TTFT, TPOT, preemptions, peak mapped bytes, the
device's free memory, and for kvcached its patches, segment, ballast and per-page map costs) and
each engine's log under OUT/logs. A smoke run: one repeat, one PEAK; not a record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from workbench.engines.metrics import summarize
from workbench.engines.real import kvcached as kvc
from workbench.engines.real import shapes
from workbench.engines.real.kvcached_budget import setting_budget
from workbench.engines.sched.request import Request
from workbench.engines.sim.workloads import kvcached_ramp_traces
from workbench.labs.kit import server_rig as rig

MODEL = "llama-3.1-8b"
# vLLM 0.9.2's serving defaults on an A100 (kvcached's run passed neither): 256 sequences, 2048
# tokens a step; prompts and completions of 256
SPEC = dict(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=576, block_size=16,
            prefix_caching=False, load_format="dummy", cuda_graphs=True,
            gpu_memory_utilization=0.2)


def engines(mode: str, model: str, py: str, root: Path, budget: int) -> list:
    per_block = 16 * shapes.kv_bytes_per_token(MODEL)
    total = budget // per_block
    out = []
    for i in range(3):
        name = f"{mode}{i}"
        if mode == "kvcached":
            out.append(kvc.engine(name, model, root, num_gpu_blocks=total,
                                  kv_cache_bytes=total * per_block, **SPEC))
            continue
        blocks = total if mode == "elastic" else total // 3
        knobs = {"gpu_budget": str(budget), "min_reserved_pages": "0",
                 "max_reserved_pages": "1"} if mode == "elastic" else {}
        out.append(rig.engine(name, "gpu", model, py, root, elastic=mode == "elastic",
                              knobs=knobs, num_gpu_blocks=blocks,
                              kv_cache_bytes=blocks * per_block, **SPEC))
    return out


def run_point(es: list, peak: int) -> dict:
    span = rig.VOCAB_HI - rig.VOCAB_LO
    t0 = time.monotonic()
    for e in es:
        e.t0 = t0  # one clock for the three models' ramps
    pre = [rig.counters(e).get("num_preemptions", 0.0) for e in es]
    base = es[0].clock() + 0.5
    reqs = []
    for e, trace in zip(es, kvcached_ramp_traces(peak, 3), strict=True):
        batch = [Request(len(e.requests) + r.rid, [rig.VOCAB_LO + t % span for t in r.prompt],
                         r.max_new_tokens, base + r.arrival, r.group) for r in trace]
        e.submit(batch)
        reqs.append(batch)
    last = max(r.arrival for b in reqs for r in b)
    for e in es:
        e.advance(last + 300.0)
    wall = es[0].clock() - base
    time.sleep(0.5)
    post = [rig.counters(e).get("num_preemptions", 0.0) for e in es]
    return summary(es, reqs, base, wall, [b - a for a, b in zip(pre, post, strict=True)])


def summary(es: list, reqs: list, base: float, wall: float, pre: list) -> dict:
    allr = [r for b in reqs for r in b]
    o = summarize(allr).as_dict()
    free = [f for t, f in es[0].free_samples if base <= t <= base + wall]
    peak_mapped = 0
    for t in np.arange(0.0, wall, 0.25):  # the sum over engines, each at its last sample
        now = [max((s for s in e.samples if s.t <= base + t), key=lambda s: s.t,
                   default=None) for e in es]
        peak_mapped = max(peak_mapped, sum(s.mapped_bytes for s in now if s))
    return {"requests": o["requests"], "finished": o["finished"],
            "ttft_mean_ms": round(o["ttft"]["mean"] * 1e3, 1),
            "ttft_p99_ms": round(o["ttft"]["p99"] * 1e3, 1),
            "tpot_mean_ms": round(o["tpot"]["mean"] * 1e3, 2),
            "per_model_ttft_mean_ms": [round(summarize(b).ttft.mean * 1e3, 1) for b in reqs],
            "preemptions": [int(p) for p in pre], "wall_s": round(wall, 1),
            "peak_mapped_bytes": peak_mapped or None,
            "free_min": min(free) if free else None}


def one_mode(mode: str, model: str, py: str, root: Path, budget: int, peak: int) -> dict:
    es = engines(mode, model, py, root, budget)
    ballast = kvc.Ballast()
    out: dict = {"mode": mode}
    try:
        t = time.monotonic()
        rig.start_all(es)
        out["start_s"] = round(time.monotonic() - t, 1)
        if mode == "kvcached":
            out["engines"] = [e.facts() for e in es]
            out["ballast"] = kvc.cap_at_budget(es, budget, ballast)
        rig.send(es[0], [[rig.VOCAB_LO + k for k in range(256)]], 8, es[0].sampling)  # warm-up
        for e in es[1:]:
            rig.send(e, [[rig.VOCAB_LO + k for k in range(256)]], 8, e.sampling)
        out.update(run_point(es, peak))
        if mode == "kvcached":
            costs = [e.map_costs() for e in es]
            out["map_us_per_page"] = {k: _p(sum((c[k] for c in costs), [])) for k in costs[0]}
    except Exception as exc:  # noqa: BLE001 - the record says why a mode could not run
        out["error"] = " ".join(str(exc).split())[:2000]
    finally:
        for e in es:
            e.close()
        ballast.release()
    return out


def _p(xs: list[float]) -> dict:
    return {"n": len(xs), "p50": float(np.percentile(xs, 50)) if xs else None,
            "p99": float(np.percentile(xs, 99)) if xs else None}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--peak", type=int, default=4)
    ap.add_argument("--modes", default="static,elastic,kvcached")
    a = ap.parse_args(argv)
    out = Path(a.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    os.environ["WORKBENCH_VLLM_LOGS"] = str(out / "logs")
    budget = setting_budget().total_bytes
    py = rig.python_for("colocation")
    root = rig.workroot()
    model = str(shapes.write(root / f"{MODEL}-dummy", rig.model_dir(py, root), MODEL))
    res = {"peak": a.peak, "budget_bytes": budget, "budget": setting_budget().gib(),
           "spec": SPEC, "modes": []}
    for mode in a.modes.split(","):
        res["modes"].append(one_mode(mode, model, py, root, budget, a.peak))
        (out / "result.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res["modes"][-1])[:1500], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
