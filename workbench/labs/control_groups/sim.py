"""Control-groups lab (seed 000 §14): the five control groups of §14.2 on one workload, and why
the README's "2-28x TTFT" belongs to its workload.

Groups (§14.2), every other setting equal:

* **A** the engine's native static split (``gpu_memory_utilization`` 0.31 per instance);
* **B** KVCacheD, preallocation off, prefix cache off;
* **C** KVCacheD, preallocation on (reserve 5..10 pages), prefix cache off;
* **D** KVCacheD, prefix cache bounded (``max_cached_tokens``);
* **E** KVCacheD, prefix cache unlimited.

Workloads, each three vLLM-like Llama-3.1-8B instances on one simulated A100-80G (the colocation
setup, :mod:`workbench.engines.sim.cluster`):

* ``readme``: kvcached's staggered ramp at one PEAK (random 256/256 prompts): the structure
  behind the README's numbers (§14.3 says a reproduction must keep it);
* ``shared_prefix``: the same arrivals, but each instance's prompts share a 192-token system
  prefix (64 tokens unique): what D and E are for;
* ``simultaneous``: all three instances ramp at the same time: no idle neighbour to lend pages.

Step times use the ``kvcached-fit`` calibration by default (the colocation lab's hand fit that
puts the static knee where kvcached measured it); ``steptime="roofline"`` for the defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.config import PoolConfig
from workbench.engines.sched.request import Request
from workbench.engines.sim.cluster import ClusterConfig, run_cluster
from workbench.engines.sim.vllm_like import VLLMOptions
from workbench.engines.sim.workloads import VOCAB, ramp_arrivals, ramp_trace
from workbench.errors import ConfigError
from workbench.labs.control_groups.params import WORKLOADS
from workbench.labs.kit.base import Progress
from workbench.labs.kit.steptime import parse_steptime

if TYPE_CHECKING:
    from workbench.labs.control_groups.params import ControlGroupsParams

GROUPS = ("A", "B", "C", "D", "E")
GROUP_TEXT = {
    "A": "native static split", "B": "KVCacheD, prealloc off, prefix off",
    "C": "KVCacheD, prealloc on, prefix off", "D": "KVCacheD, bounded prefix cache",
    "E": "KVCacheD, unlimited prefix cache"}


def group_config(group: str, p: ControlGroupsParams, steptime: dict, seed: int) -> ClusterConfig:
    pool, vllm = PoolConfig(), VLLMOptions()
    if group == "B":
        pool = PoolConfig(prealloc=False)
    elif group in ("D", "E"):
        pool = PoolConfig(max_cached_tokens=p.cached_tokens if group == "D" else -1)
        vllm = VLLMOptions(enable_prefix_caching=True)
    return ClusterConfig(mode="static" if group == "A" else "elastic", pool=pool, vllm=vllm,
                         steptime=dict(steptime), seed=seed)


def workload(kind: str, peak: int, seed: int) -> list[list[Request]]:
    if kind == "readme":
        return [ramp_trace(peak, i, seed=seed) for i in range(3)]
    if kind == "simultaneous":  # model 0's ramp for everyone, tokens of their own
        return [ramp_trace(peak, 0, seed=seed * 10 + i) for i in range(3)]
    if kind == "shared_prefix":
        out = []
        for i in range(3):
            rng = np.random.default_rng([seed, peak, i, 7])
            system = rng.integers(1, VOCAB, size=192).tolist()
            out.append([Request(k, system + rng.integers(1, VOCAB, size=64).tolist(), 256, t,
                                f"model{i}") for k, t in enumerate(ramp_arrivals(peak, i))])
        return out
    raise ConfigError(f"workload {kind!r}", "is not a workload of this lab",
                      f"use one of {', '.join(WORKLOADS)}")


def _ms(d: Any) -> dict[str, float]:
    return {k: round(getattr(d, k) * 1e3, 1) for k in ("p50", "p95", "p99", "mean")}


def run_cell(kind: str, group: str, p: ControlGroupsParams, steptime: dict,
             seed: int) -> dict[str, Any]:
    res = run_cluster(group_config(group, p, steptime, seed), workload(kind, p.peak, seed))
    o = res.overall
    return {"workload": kind, "group": group, "seed": seed, "requests": o.requests,
            "finished": o.finished, "ttft_ms": _ms(o.ttft), "itl_ms": _ms(o.itl),
            "tpot_ms": _ms(o.tpot), "e2e_ms": _ms(o.e2e),
            "goodput_req_per_s": round(o.goodput_req_per_s, 3),
            "slo_attainment": round(o.slo_attainment, 4), "preemptions": o.preemptions,
            "prefix_hit_tokens": o.prefix_hit_tokens, "prompt_tokens": o.prompt_tokens,
            "misses": sum(i.stats["misses"] for i in res.instances),
            "step_vmm_s": round(sum(i.vmm_s for i in res.instances), 4),
            "cpu_s": round(res.cpu_s, 2)}


def sweep(p: ControlGroupsParams, progress: Progress | None = None) -> list[dict[str, Any]]:
    steptime = parse_steptime(p.steptime)
    kinds = ("readme", "simultaneous") if p.quick else tuple(p.workloads)
    for k in kinds:
        if k not in WORKLOADS:
            raise ConfigError(f"workload {k!r}", "is not a workload of this lab",
                              f"use one of {', '.join(WORKLOADS)}")
    repeats = 1 if p.quick else max(1, p.repeats)
    cells: dict[tuple[str, str], list[dict]] = {}
    done, total = 0, len(kinds) * len(GROUPS) * repeats
    for r in range(repeats):
        order = GROUPS if r % 2 == 0 else GROUPS[::-1]  # alternate (seed 003 §2.3)
        for kind in kinds:
            for g in order:
                cell = run_cell(kind, g, p, steptime, p.seed + r)
                cell["position"] = order.index(g)
                cells.setdefault((kind, g), []).append(cell)
                done += 1
                if progress:
                    progress(done, total, f"{kind} group {g}")
    rows = []
    for kind in kinds:
        base = cells[(kind, "A")][0]
        for g in GROUPS:
            first = dict(cells[(kind, g)][0])
            first["repeats"] = cells[(kind, g)]
            first["ttft_p50_vs_A"] = round(base["ttft_ms"]["p50"] / first["ttft_ms"]["p50"], 2)
            first["ttft_p99_vs_A"] = round(base["ttft_ms"]["p99"] / first["ttft_ms"]["p99"], 2)
            first["ttft_mean_vs_A"] = round(base["ttft_ms"]["mean"] / first["ttft_ms"]["mean"],
                                            2)
            rows.append(first)
    return rows


