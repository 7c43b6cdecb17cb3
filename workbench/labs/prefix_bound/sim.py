"""Prefix-cache bound (seed 000 §9, experiment 5; seed 003 E4): ``max_cached_tokens`` -1
(unlimited), 0 (evict as soon as no request holds a block) and N, one at a time, on one instance.

* **Classes.** Mixed traffic of three request classes (our reading; the seed's list of them is
  not in our copy): *shared* (one of a few long system prefixes + a unique question), *unique*
  (nothing shared) and *repeat* (an exact earlier prompt), then an idle tail. Per bound: hits
  (per token and per request, with their denominators), computed prefill tokens, TTFT
  percentiles, mapped pages at the peak and when idle, evictions, page occupancy.
* **Groups A-D** (seed 003 E4, :func:`workbench.engines.sim.workloads.prefix_groups`): a warm
  document request, then probes one at a time: A same document (full hit), B an early token
  changed (the chain breaks there), C a late token changed (reuse up to its block), D the
  document after another preamble (no prefix reuse). Hit depth against TTFT, per bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.engines.sched.request import Request
from workbench.engines.sim.cluster import SIM_ENGINES
from workbench.engines.sim.workloads import VOCAB, Phase, prefix_groups
from workbench.labs.kit.base import Progress
from workbench.labs.kit.phased_sim import InstanceSpec, RunSpec, run_phased, with_cache

if TYPE_CHECKING:
    from workbench.labs.prefix_bound.params import PrefixBoundParams

CLASSES = ("shared", "unique", "repeat")


def three_classes(p: PrefixBoundParams, seed: int) -> list[Request]:
    """Poisson arrivals, the class drawn uniformly; ``group`` is ``class:key`` (key: which shared
    prefix or which repeated prompt; the request id for a unique one)."""
    rng = np.random.default_rng([seed, 9])
    tok = lambda n: rng.integers(1, VOCAB, size=n).tolist()  # noqa: E731
    prefixes = [tok(p.prefix_len) for _ in range(p.num_prefixes)]
    prompts = [tok(p.prefix_len + p.suffix_len) for _ in range(p.num_repeat_prompts)]
    gaps = rng.exponential(1.0 / p.rate, size=int(p.rate * p.traffic_s * 3) + 8)
    times = np.cumsum(gaps)
    out = []
    for i, t in enumerate(times[times < p.traffic_s]):
        cls = CLASSES[int(rng.integers(len(CLASSES)))]
        if cls == "shared":
            k = int(rng.integers(p.num_prefixes))
            prompt = prefixes[k] + tok(p.suffix_len)
        elif cls == "repeat":
            k = int(rng.integers(p.num_repeat_prompts))
            prompt = list(prompts[k])
        else:
            k, prompt = i, tok(p.prefix_len + p.suffix_len)
        out.append(Request(i, prompt, p.output_len, float(t), f"{cls}:{k}"))
    return out


def group_probes(p: PrefixBoundParams, seed: int) -> tuple[list[Request], dict[int, dict]]:
    """The warm request at 0 and the A-D probes one at a time after it (a second apart, so each
    finds the cache as the bound left it); ``rid -> {group, expected_hit}``."""
    warm, cases = prefix_groups(doc_len=p.doc_len, per_group=p.probes_per_group,
                                output_len=16, seed=seed)
    warm.group = "warm"
    reqs, meta = [warm], {warm.rid: {"group": "warm", "expected_hit": 0}}
    for i, c in enumerate(cases):
        c.request.arrival = 2.0 + i * 1.0
        reqs.append(c.request)
        meta[c.request.rid] = {"group": c.group, "expected_hit": c.expected_hit_tokens}
    return reqs, meta


def _run(p: PrefixBoundParams, bound: int, seed: int, reqs: list[Request],
         phases: list[Phase]) -> dict[str, Any]:
    spec = RunSpec([InstanceSpec(p.engine, phases, requests=reqs)], model=p.model, gpu=p.gpu,
                   kv_budget_gib=None, seed=seed)
    on = {kind: kind == p.engine for kind in SIM_ENGINES}  # only this scheduler's cache
    return run_phased(with_cache(spec, **on, vllm_bound=bound, sglang_bound=bound))


def bounds(p: PrefixBoundParams) -> tuple[int, ...]:
    return (-1, 0, p.bounded)


def group_bounds(p: PrefixBoundParams) -> tuple[int, ...]:
    """The groups' settings: the three bounds and one smaller than the document."""
    return tuple(dict.fromkeys((*bounds(p), p.doc_bound)))


def sweep(p: PrefixBoundParams, progress: Progress | None = None) -> dict[str, Any]:
    n = p.repeats if p.repeats is not None else (2 if p.quick else 3)
    seeds = [p.seed + i for i in range(n)]
    bs = group_bounds(p)
    order = [(b, s) for i, s in enumerate(seeds) for b in (bs if i % 2 == 0 else bs[::-1])]
    classes: dict[int, dict[int, dict]] = {b: {} for b in bounds(p)}
    groups: dict[int, dict[int, dict]] = {b: {} for b in bs}
    for k, (b, s) in enumerate(order):
        if b in classes:
            phases = [Phase("traffic", p.traffic_s), Phase("idle", p.idle_s)]
            classes[b][s] = _run(p, b, s, three_classes(p, s), phases)
        reqs, meta = group_probes(p, s)
        span = reqs[-1].arrival + 2.0
        run = _run(p, b, s, reqs, [Phase("probes", span)])
        groups[b][s] = {"run": run, "meta": meta}
        if progress:
            progress(k + 1, len(order), f"bound {b} seed {s}")
    return {"seeds": seeds, "order": [f"{b}/{s}" for b, s in order], "classes": classes,
            "groups": groups}


