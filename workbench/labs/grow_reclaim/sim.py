"""Grow and reclaim (seed 000 §6, experiment 2): one elastic instance, traffic idle -> short ->
long -> idle -> the same traffic again -> idle. Mapped pages follow the load; when requests end
only pages with no live block go back (parked in the reserve up to its maximum, unmapped past
it); the reserve and the background preallocation keep a floor mapped.

Three variants, one factor changed from the baseline each (seed 003 §2): the baseline (prefix
cache off, preallocation on), prefix cache on (unbounded), preallocation off. Each runs for
several seeds, in alternating order. A watch on every unmap checks that no page holding a live
block is ever unmapped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.config import PoolConfig
from workbench.engines.sim.workloads import Phase
from workbench.labs.kit.base import Progress
from workbench.labs.kit.phased_sim import InstanceSpec, RunSpec, run_phased, with_cache

if TYPE_CHECKING:
    from workbench.labs.grow_reclaim.params import GrowReclaimParams

VARIANTS = ("baseline", "prefix-cache", "no-prealloc")
LOAD, IDLE = ("short", "long", "short-again", "long-again"), ("idle-0", "idle-1", "idle-2")


def phases(p: GrowReclaimParams) -> list[Phase]:
    """The seed's order; the second short and long phases repeat the first ones exactly; the idle
    phases after load last twice as long, so the requests finish inside them."""
    short = Phase("short", p.phase_s, p.short_rate, p.short_len, p.short_len, prompt_key=1)
    long = Phase("long", p.phase_s, p.long_rate, p.long_prompt, p.long_output, prompt_key=2)
    idle = 2 * p.phase_s  # long enough for the long requests' decodes to drain
    return [Phase("idle-0", p.phase_s / 2), short, long, Phase("idle-1", idle),
            short._replace(name="short-again"), long._replace(name="long-again"),
            Phase("idle-2", idle)]


def spec_for(variant: str, p: GrowReclaimParams, seed: int) -> RunSpec:
    pool = PoolConfig(min_reserved_pages=p.min_reserved_pages,
                      max_reserved_pages=p.max_reserved_pages, prealloc=variant != "no-prealloc")
    spec = RunSpec([InstanceSpec("vllm", phases(p))], model=p.model, gpu=p.gpu,
                   kv_budget_gib=None, pool=pool, seed=seed)
    return with_cache(spec, vllm=variant == "prefix-cache", sglang=False)


def run_order(seeds: list[int]) -> list[tuple[str, int]]:
    """Every (variant, seed), the variant order reversed on every other seed."""
    out = []
    for i, s in enumerate(seeds):
        order = VARIANTS if i % 2 == 0 else tuple(reversed(VARIANTS))
        out += [(v, s) for v in order]
    return out


def sweep(p: GrowReclaimParams, progress: Progress | None = None) -> dict[str, Any]:
    n = p.repeats if p.repeats is not None else (2 if p.quick else 4)
    seeds = [p.seed + i for i in range(n)]
    order = run_order(seeds)
    runs: dict[str, dict[int, dict]] = {v: {} for v in VARIANTS}
    for i, (v, s) in enumerate(order):
        runs[v][s] = run_phased(spec_for(v, p, s))
        if progress:
            progress(i + 1, len(order), f"{v} seed {s}")
    return {"seeds": seeds, "order": [f"{v}/{s}" for v, s in order], "runs": runs}


