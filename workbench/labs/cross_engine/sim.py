"""A vLLM-like and an SGLang-like instance on one device (seed 000 §8, experiment 4): they share
no block table and no radix tree, only the device's physical headroom. The seed's six stages:

1. both prefix caches off: each engine alone (the allocation baseline);
2. alternating peaks: memory one engine held is mapped by the other (both orders);
3. both peak at once: each scheduler handles its own allocation misses (vLLM preempts and
   recomputes, SGLang retracts and admits conservatively);
4. only vLLM's prefix cache on (unbounded): its cached pages shrink SGLang's headroom;
5. only SGLang's radix cache on: the reverse;
6. both caches on with different bounds, both peaking after a warm-up: who wins follows the
   bounds (swapped in a second run), beside a caches-off reference. Nothing schedules fairly.

Every peak sends the same traffic (one arrival seed, one prompt key) so stages differ in the
factor they name. Each seed runs every configuration, the order reversed on odd seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.engines.sim.workloads import Phase
from workbench.labs.kit.base import Progress
from workbench.labs.kit.phased_sim import InstanceSpec, RunSpec, run_phased, with_cache

if TYPE_CHECKING:
    from workbench.labs.cross_engine.params import CrossEngineParams

KINDS = ("vllm", "sglang")
PEAK, WARM = 7, 3  # prompt keys: every peak phase the same traffic; warm-ups their own


@dataclass(slots=True)
class Config:
    """One run: each engine's phases and cache settings (``None`` bound: cache off)."""

    stage: int
    name: str
    phases: dict[str, list[Phase]]  # kind -> phases (the same names for both)
    bounds: dict[str, int | None]


def configs(p: CrossEngineParams) -> list[Config]:
    peak = Phase("", p.phase_s, p.peak_rate, p.prompt_len, p.output_len, prompt_key=PEAK)
    idle = Phase("", p.phase_s)
    warm = Phase("", p.phase_s, p.warm_rate, p.prompt_len, p.output_len, prompt_key=WARM)
    pause = Phase("", p.phase_s / 3)
    names = ("P1", "P2", "P3", "tail")

    def plan(v: list[Phase], s: list[Phase], labels=names) -> dict[str, list[Phase]]:
        return {"vllm": [x._replace(name=n) for x, n in zip(v, labels, strict=True)],
                "sglang": [x._replace(name=n) for x, n in zip(s, labels, strict=True)]}

    off = {"vllm": None, "sglang": None}
    alt_v = plan([peak, idle, peak, idle], [idle, peak, idle, idle])
    alt_s = plan([idle, peak, idle, idle], [peak, idle, peak, idle])
    six = ("warm", "pause", "peak", "tail")
    both = plan([warm, pause, peak, idle], [warm, pause, peak, idle], six)
    return [
        Config(1, "alone-vllm", plan([peak, idle, idle, idle], [idle] * 4), off),
        Config(1, "alone-sglang", plan([idle] * 4, [peak, idle, idle, idle]), off),
        Config(2, "alternate-vllm-first", alt_v, off),
        Config(2, "alternate-sglang-first", alt_s, off),
        Config(3, "together", plan([peak, peak, idle, idle], [peak, peak, idle, idle]), off),
        Config(4, "vllm-cache-only", alt_v, {"vllm": -1, "sglang": None}),
        Config(5, "sglang-cache-only", alt_s, {"vllm": None, "sglang": -1}),
        Config(6, "bounds-off", both, off),
        Config(6, "bounds-vllm-big", both, {"vllm": p.big_bound, "sglang": p.small_bound}),
        Config(6, "bounds-sglang-big", both, {"vllm": p.small_bound, "sglang": p.big_bound}),
    ]


def spec_for(c: Config, p: CrossEngineParams, seed: int) -> RunSpec:
    spec = RunSpec([InstanceSpec(k, c.phases[k], traffic_seed=seed) for k in KINDS],
                   model=p.model, gpu=p.gpu, kv_budget_gib=p.kv_budget_gib, seed=seed)
    b = c.bounds
    return with_cache(spec, vllm=b["vllm"] is not None, sglang=b["sglang"] is not None,
                      vllm_bound=-1 if b["vllm"] is None else b["vllm"],
                      sglang_bound=-1 if b["sglang"] is None else b["sglang"])


def sweep(p: CrossEngineParams, progress: Progress | None = None) -> dict[str, Any]:
    n = p.repeats if p.repeats is not None else (2 if p.quick else 3)
    cfgs = configs(p)
    order = []
    for i in range(n):
        seq = cfgs if i % 2 == 0 else cfgs[::-1]
        order += [(c, p.seed + i) for c in seq]
    runs: dict[str, dict[int, dict]] = {c.name: {} for c in cfgs}
    for k, (c, seed) in enumerate(order):
        runs[c.name][seed] = run_phased(spec_for(c, p, seed))
        if progress:
            progress(k + 1, len(order), f"stage {c.stage} {c.name} seed {seed}")
    return {"seeds": [p.seed + i for i in range(n)], "configs": cfgs, "runs": runs,
            "order": [f"{c.name}/{s}" for c, s in order]}


