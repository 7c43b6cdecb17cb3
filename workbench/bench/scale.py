"""``workbench bench scale``: how the simulator's cost grows with the work it simulates.

One point is a cluster of ``instances`` elastic engines sharing one simulated device, each fed its
own Poisson trace of ``requests`` requests (the "10x" points multiply the trace length). The figure
is simulated seconds per CPU second of this process (``time.process_time``, so other load on the
host does not skew it): above 1 the simulator runs faster than the system it models.

The model is ``tiny`` (2 layers) so that 64 instances' weights fit one device (4 GiB of virtual KV
each, all of it mappable: the trace never fills it), and each instance
gets its own compute (``shared_gpu=False``): N instances are N times the work per simulated second,
which is what a scaling curve must measure. Step times still carry the preset's per-step host
overhead, so an instance with work steps every few simulated milliseconds, as a real one would.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from workbench.bench.params import check
from workbench.engines.sim.cluster import ClusterConfig, run_cluster
from workbench.engines.sim.workloads import poisson

# Each pool's virtual range. A pool's setup is O(virtual blocks): over a whole H200 a tiny-model
# pool would be ~9M blocks (0.3 s and ~0.5 GB each), so 64 of them would measure setup, not work.
VIRTUAL_BYTES = 4 << 30
REAL_TIME_GOAL = 10.0  # simulated seconds per CPU second below which a point needs a reason


@dataclass(frozen=True, slots=True)
class ScalePoint:
    instances: int
    requests: int  # per instance
    rate: float = 2.0  # requests per second per instance
    prompt_len: int = 256
    output_len: int = 128


def default_points(requests: int = 20, longer: int = 10) -> list[ScalePoint]:
    check("scale", requests=requests, longer=longer)
    """1, 3, 16 and 64 instances on a base trace, then 1, 3 and 16 on a ``longer``x one."""
    pts = [ScalePoint(n, requests) for n in (1, 3, 16, 64)]
    return pts + [ScalePoint(n, requests * longer) for n in (1, 3, 16)]


def _config(p: ScalePoint, seed: int) -> tuple[ClusterConfig, list]:
    cfg = ClusterConfig(mode="elastic", model="tiny", gpu="h200", num_instances=p.instances,
                        activation_bytes=64 << 20, shared_gpu=False, seed=seed,
                        sample_every_s=1.0, kv_virtual_bytes=VIRTUAL_BYTES)
    wl = [poisson(p.rate, p.requests, prompt_len=p.prompt_len, output_len=p.output_len,
                  seed=seed * 1000 + i, rid0=i * p.requests) for i in range(p.instances)]
    return cfg, wl


def run_point(p: ScalePoint, seed: int = 0) -> dict:
    """One simulation: simulated seconds, CPU seconds, steps and requests."""
    cfg, wl = _config(p, seed)
    res = run_cluster(cfg, wl)
    steps = sum(r.steps for r in res.instances)
    return {"sim_s": res.sim_s, "cpu_s": res.cpu_s, "wall_s": res.wall_s, "steps": steps,
            "requests": sum(len(w) for w in wl),
            "sim_per_cpu": res.sim_s / res.cpu_s if res.cpu_s else float("inf")}


def profile_point(p: ScalePoint, top: int = 12) -> str:
    """cProfile of one run of ``p``: the ``top`` functions by own time, as text."""
    prof = cProfile.Profile()
    prof.enable()
    run_point(p)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def run_scale(points: list[ScalePoint] | None = None, repeats: int = 3,
              progress: Callable[[str], None] | None = None) -> dict:
    """Every point ``repeats`` times (seeds 0..repeats-1): medians and spread of each figure."""
    check("scale", repeats=repeats)
    say = progress or (lambda _m: None)
    rows = []
    for p in points or default_points():
        runs = []
        for seed in range(repeats):
            say(f"{p.instances} instances x {p.requests} requests, run {seed + 1}/{repeats}")
            runs.append(run_point(p, seed))
        per_step_us = [r["cpu_s"] / r["steps"] * 1e6 for r in runs if r["steps"]]
        rows.append({
            "instances": p.instances, "requests_per_instance": p.requests,
            "sim_per_cpu": _spread([r["sim_per_cpu"] for r in runs]),
            "sim_s": _spread([r["sim_s"] for r in runs]),
            "cpu_s": _spread([r["cpu_s"] for r in runs]),
            "steps": _spread([float(r["steps"]) for r in runs]),
            "cpu_us_per_step": _spread(per_step_us) if per_step_us else None,
        })
    return {"goal_sim_per_cpu": REAL_TIME_GOAL, "repeats": repeats, "points": rows}


def summary_lines(res: dict) -> list[str]:
    """One line per point: median and range of simulated seconds per CPU second."""
    out = []
    for r in res["points"]:
        s, st = r["sim_per_cpu"], r["cpu_us_per_step"]
        flag = "" if s["median"] >= res["goal_sim_per_cpu"] else "  (below 10x real time)"
        out.append(f"scale instances={r['instances']:>3} req/inst={r['requests_per_instance']:>4}"
                   f"  sim/cpu median {s['median']:8.1f} [{s['min']:.1f}, {s['max']:.1f}]"
                   f"  sim {r['sim_s']['median']:7.1f} s  cpu {r['cpu_s']['median']:6.2f} s"
                   f"  steps {r['steps']['median']:8.0f}"
                   f"  cpu/step {st['median'] if st else float('nan'):6.1f} us{flag}")
    return out
