"""Two same-kind instances on one device (seed 000 §7, experiment 3), the seed's phases:

* **A** both idle;  **B** only the first peaks;  **C** the first drains, the second peaks;
* **D** both peak;  **E** the first shuts down gracefully (drains, then closes its pool) while
  the second keeps peaking; then an idle tail.

The device's KV headroom is a few GiB (a ballast holds the rest), so what one instance frees is
what the other can grow into. Every peak phase sends the same traffic (one arrival seed, one
prompt key), so B and C (alone) and D (together) differ only in the other instance's load. The
roles swap on every other repeat. Beside it, the IPC-name point of §7.1 on the real control
plane (:mod:`workbench.labs.kit.ipc_names`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.config import PoolConfig
from workbench.engines.sim.workloads import Phase
from workbench.labs.kit.base import Progress
from workbench.labs.kit.phased_sim import (
    GiB,
    InstanceSpec,
    RunSpec,
    run_phased,
    window_slice,
    with_cache,
)

if TYPE_CHECKING:
    from workbench.labs.same_engine_pair.params import PairParams

PHASES = ("A", "B", "C", "D", "E", "tail")
PEAK_KEY = 7  # every peak phase: the same arrivals and prompts


def pair_spec(p: PairParams, seed: int, first: int) -> RunSpec:
    """The run where instance ``first`` (0 or 1) peaks first and shuts down in E."""
    peak = Phase("", p.phase_s, p.peak_rate, p.prompt_len, p.output_len, prompt_key=PEAK_KEY)
    idle, short = Phase("", p.phase_s), Phase("", p.phase_s / 3)
    # E is twice as long: the first drains its D backlog before it exits, and the second
    # must still be peaking after that
    e_peak = peak._replace(duration_s=2 * p.phase_s, prompt_key=PEAK_KEY + 1)
    ramp = ({"A": short, "B": peak, "C": idle, "D": peak, "E": idle._replace(
                duration_s=2 * p.phase_s), "tail": idle},
            {"A": short, "B": idle, "C": peak, "D": peak, "E": e_peak, "tail": idle})
    roles = ramp if first == 0 else ramp[::-1]
    insts = []
    for i, table in enumerate(roles):
        phases = [table[n]._replace(name=n) for n in PHASES]
        stop = sum(ph.duration_s for ph in phases[:4]) if i == first else None
        insts.append(InstanceSpec(p.kind, phases, shutdown_after=stop, traffic_seed=seed))
    spec = RunSpec(insts, model=p.model, gpu=p.gpu, kv_budget_gib=p.kv_budget_gib,
                   pool=PoolConfig(), seed=seed)
    return with_cache(spec, vllm=False, sglang=False)  # seed 000 §5: prefix caches off


def _phase(run: dict, name: str, phase: str) -> dict[str, list]:
    w = next(w for w in run["windows"][name] if w["name"] == phase)
    return window_slice(run["timeline"][name], w["start"], w["end"])


def pair_checks(run: dict[str, Any], first: int) -> dict[str, Any]:
    """The phases' claims, measured: who grows, who gives back, who waits."""
    names = [i["name"] for i in run["instances"]]
    f, s = names[first], names[1 - first]
    by = {i["name"]: i["by_phase"] for i in run["instances"]}
    peak = {(n, ph): max(_phase(run, n, ph)["mapped_bytes"], default=0) for n in names
            for ph in PHASES}
    end = {(n, ph): _phase(run, n, ph)["mapped_bytes"][-1] for n in names for ph in PHASES}
    tl = run["timeline"]
    total = [a + b for a, b in zip(tl[f]["mapped_bytes"], tl[s]["mapped_bytes"], strict=True)]
    budget = run["kv_budget_bytes"]

    def p99(n: str, ph: str) -> float:
        return by[n][ph]["ttft"]["p99"]

    d = {n: by[n]["D"] for n in names}
    return {
        "first": f, "second": s,
        "B_first_grows": peak[(f, "B")] > end[(f, "A")],
        "B_second_flat": min(_phase(run, s, "B")["mapped_bytes"]) == peak[(s, "B")],
        "C_first_gives_back": end[(f, "C")] < peak[(f, "B")],
        "C_second_grows_into_freed": peak[(s, "C")] + peak[(f, "B")] > budget,
        "never_above_budget": max(total) <= budget,
        "D_at_budget": max(total[i] for i, t in enumerate(tl[f]["t"])
                           if _in(run, f, "D", t)) >= budget - 2 * run["page_id_bytes"],
        "D_slower_than_alone": p99(f, "D") > p99(f, "B") and p99(s, "D") > p99(s, "C"),
        "D_misses_or_preemptions": sum(x["preemptions"] for x in d.values()),
        "E_first_released_all": tl[f]["mapped_bytes"][-1] == 0,
        "E_second_grows_past_D": max((m for t, m in zip(tl[s]["t"], tl[s]["mapped_bytes"],
                                                        strict=True)
                                      if t >= run["shutdowns"].get(f, float("inf"))),
                                     default=0) > peak[(s, "D")],
        "live_unmaps": len(run["live_unmaps"]),
        "peak_gib": {f"{n}/{ph}": round(v / GiB, 3) for (n, ph), v in peak.items()},
        "ttft_p99_ms": {f"{n}/{ph}": round(p99(n, ph) * 1e3, 1) for n in names
                        for ph in PHASES if ph in by[n]}}


def _in(run: dict, name: str, phase: str, t: float) -> bool:
    w = next(w for w in run["windows"][name] if w["name"] == phase)
    return w["start"] - 1e-9 <= t < w["end"] - 1e-9


def sweep(p: PairParams, progress: Progress | None) -> dict[str, Any]:
    n = p.repeats if p.repeats is not None else (2 if p.quick else 4)
    runs = []
    for i in range(n):
        first = i % 2  # alternate which instance peaks first
        run = run_phased(pair_spec(p, p.seed + i, first))
        runs.append({"seed": p.seed + i, "first": first, "run": run,
                     "checks": pair_checks(run, first)})
        if progress:
            progress(i + 1, n, f"seed {p.seed + i}, instance {first} first")
    return {"runs": runs}


