"""Baseline lab (seed 003 E1): the latency-throughput curve of one instance as the open-loop
request rate rises, and where it saturates.

One simulated vLLM-like (or SGLang-like) Llama-3.1-8B instance with its own static KV split on
an A100-80G; Poisson arrivals of one of E1's loads (128/128, 4096/128, 128/1024 or their mix) at
each rate; every rate repeated with different workload seeds, the rate order alternating between
repeats (seed 003 §2). Percentiles pool the repeats' requests; the record keeps each repeat.

Rules, stated before the run:

* **stable under SLO**: at least ``stable_attainment`` of the requests meet TTFT <= 1 s and
  TPOT <= 100 ms (the project's default SLO); the **knee** is the highest stable rate;
* **saturated**: in the middle half of the arrival window, requests finish at under
  ``saturation_ratio`` of the rate they arrive (:func:`workbench.labs.kit.serving.steady_ratio`):
  the queue grows without bound. The saturation rate is the first saturated one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.engines.metrics import SLO
from workbench.engines.sched.request import Request
from workbench.errors import ConfigError
from workbench.labs.kit.base import Progress
from workbench.labs.kit.serving import WORKLOADS, InstanceSetup, latency_row, run, workload

if TYPE_CHECKING:
    from workbench.labs.baseline.params import BaselineParams

DEFAULT_RATES: dict[str, tuple[float, ...]] = {
    "mix": (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0),
    "short": (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 80.0),
    "long_in": (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0),
    "long_out": (1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0),
}


def plan(p: BaselineParams) -> tuple[list[float], int, int]:
    if p.workload not in WORKLOADS:
        raise ConfigError(f"workload {p.workload!r}", "is not a load of seed 003 E1",
                          f"use one of {', '.join(WORKLOADS)}")
    rates = sorted(p.rates or DEFAULT_RATES[p.workload])
    if not rates or min(rates) <= 0:
        raise ConfigError(f"rates {p.rates!r}", "need at least one positive rate",
                          "pass e.g. rates=1,2,4")
    if p.quick:
        rates = rates[::2] if len(rates) > 5 else rates
        return rates, min(p.num_requests, 400), 1
    return rates, p.num_requests, max(1, p.repeats)


def sweep(p: BaselineParams, progress: Progress | None = None) -> list[dict[str, Any]]:
    """One row per rate: the repeats' requests pooled, each repeat's row kept."""
    rates, n, repeats = plan(p)
    setup = InstanceSetup(model=p.model, gpu=p.gpu, engine=p.engine,
                          slo=SLO(p.slo_ttft_s, p.slo_tpot_s))
    pooled: dict[float, list[Request]] = {r: [] for r in rates}
    runs: dict[float, list[dict]] = {r: [] for r in rates}
    done, total = 0, len(rates) * repeats
    for k in range(repeats):
        order = rates if k % 2 == 0 else rates[::-1]  # alternate the order (seed 003 §2.3)
        for rate in order:
            reqs = workload(p.workload, rate, n, p.seed + k)
            row = run(setup, reqs)
            runs[rate].append({"seed": p.seed + k, "position": order.index(rate), **row})
            pooled[rate].extend(reqs)
            done += 1
            if progress:
                progress(done, total, f"{rate:g} req/s, repeat {k + 1}")
    rows = []
    for rate in rates:
        row = latency_row(pooled[rate], setup.slo)
        per = runs[rate]
        # rates are per run: averaged over repeats (pooling would double-count the span)
        mean = {key: round(sum(r[key] for r in per) / len(per), 3) for key in
                ("sent_req_per_s", "req_per_s", "input_tok_per_s", "output_tok_per_s",
                 "goodput_req_per_s")}
        row.update(mean, rate=rate, repeats=per,
                   steady_ratio=round(sum(r["steady_ratio"] for r in per) / len(per), 3),
                   preemptions=sum(r["preemptions"] for r in per),
                   peak_kv_use=max(r["peak_kv_use"] for r in per),
                   ttft_p99_per_repeat_ms=[r["ttft_ms"]["p99"] for r in per])
        row["stable"] = row["slo_attainment"] >= p.stable_attainment
        row["saturated"] = row["steady_ratio"] < p.saturation_ratio
        rows.append(row)
    return rows


def knee(rows: list[dict]) -> dict[str, float | None]:
    """The stated rules over the sweep: the knee and the saturation rate (None: not reached)."""
    stable = [r["rate"] for r in rows if r["stable"]]
    sat = [r["rate"] for r in rows if r["saturated"]]
    return {"knee_rate": max(stable) if stable else None,
            "saturation_rate": min(sat) if sat else None,
            "max_output_tok_per_s": max(r["output_tok_per_s"] for r in rows)}


