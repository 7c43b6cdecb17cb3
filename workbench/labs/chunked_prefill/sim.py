"""Chunked-prefill lab (seed 003 E3): how long prompts disturb running decodes, and what the
token budget trades between the long prompts' TTFT and everyone else's ITL.

One vLLM-like Llama-3.1-8B instance (static KV, simulated A100-80G) serves a Poisson mix whose
decoding requests (128/128 and 128/1024) are joined by a fixed share of long prompts
(4096/128). Configurations, everything else equal:

* ``off``: no chunking; a prompt enters whole, so the budget must hold the longest prompt (vLLM
  insists on that too): 8192 tokens. A step carrying a 4096-token prefill takes ~0.4 s, and
  every running decode waits for it;
* ``on/B``: chunked prefill with token budget ``B``: a step carries at most ``B`` tokens
  (decodes first, then prefill chunks).

Each configuration runs at each rate with every repeat's seed; the configuration order
alternates between repeats (seed 003 §2). Distributions pool the repeats' requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.engines.metrics import SLO, Dist
from workbench.engines.sched.request import ReqState, Request
from workbench.engines.sim.vllm_like import VLLMOptions
from workbench.errors import ConfigError
from workbench.labs.kit.base import Progress
from workbench.labs.kit.serving import LONG, InstanceSetup, latency_row, mix, run

if TYPE_CHECKING:
    from workbench.labs.chunked_prefill.params import ChunkedPrefillParams

OFF_BUDGET = 8192  # chunking off: the budget must hold a whole 4096-token prompt and more


def configs(p: ChunkedPrefillParams) -> list[tuple[str, bool, int]]:
    budgets = (512, 2048) if p.quick else p.budgets
    if not budgets or min(budgets) < 16:
        raise ConfigError(f"budgets {p.budgets!r}", "need token budgets of at least 16",
                          "pass e.g. budgets=512,2048")
    return [("off", False, OFF_BUDGET)] + [(f"on/{b}", True, b) for b in sorted(budgets)]


def class_metrics(reqs: list[Request], slo: SLO, itl_slo_s: float) -> dict[str, Any]:
    """The long prompts' TTFT; the decoding requests' ITL, worst gap and TTFT."""
    long = latency_row(reqs, slo, lambda r: r.group == LONG)
    dec = [r for r in reqs if r.group != LONG and r.state is ReqState.FINISHED]
    worst = [float(np.max(np.diff(r.token_times))) for r in dec if len(r.token_times) > 1]
    d = latency_row(dec, slo)
    ms = lambda x: {k: round(getattr(Dist.of(x), k) * 1e3, 2)  # noqa: E731
                    for k in ("p50", "p95", "p99", "mean")}
    return {"long_ttft_ms": long["ttft_ms"], "long_e2e_ms": long["e2e_ms"],
            "decode_itl_ms": d["itl_ms"], "decode_ttft_ms": d["ttft_ms"],
            "decode_worst_itl_ms": ms(worst),
            "smooth_share": round(float(np.mean([w <= itl_slo_s for w in worst])), 4)
            if worst else float("nan"),
            "long_requests": long["requests"], "decode_requests": len(dec)}


def sweep(p: ChunkedPrefillParams, progress: Progress | None = None) -> list[dict[str, Any]]:
    cfgs = configs(p)
    rates = (4.0,) if p.quick else tuple(sorted(p.rates))
    repeats = 1 if p.quick else max(1, p.repeats)
    n = min(p.num_requests, 400) if p.quick else p.num_requests
    slo = SLO()
    pooled: dict[tuple[float, str], list[Request]] = {}
    runs: dict[tuple[float, str], list[dict]] = {}
    done, total = 0, len(rates) * len(cfgs) * repeats
    for k in range(repeats):
        for rate in rates:
            order = cfgs if k % 2 == 0 else cfgs[::-1]  # alternate the order (seed 003 §2.3)
            for name, chunked, budget in order:
                reqs = mix(rate, n, p.long_share, p.seed + k)
                setup = InstanceSetup(vllm=VLLMOptions(chunked_prefill=chunked,
                                                       max_num_batched_tokens=budget), slo=slo)
                row = run(setup, reqs)
                runs.setdefault((rate, name), []).append(
                    {"seed": p.seed + k, "position": order.index((name, chunked, budget)),
                     **{key: row[key] for key in ("steps", "busy_s", "sim_s", "preemptions",
                                                  "goodput_req_per_s", "output_tok_per_s",
                                                  "slo_attainment")}})
                pooled.setdefault((rate, name), []).extend(reqs)
                done += 1
                if progress:
                    progress(done, total, f"{rate:g} req/s {name} repeat {k + 1}")
    rows = []
    for rate in rates:
        for name, chunked, budget in cfgs:
            per = runs[(rate, name)]
            steps = sum(r["steps"] for r in per)
            rows.append({"rate": rate, "config": name, "chunked": chunked, "budget": budget,
                         **class_metrics(pooled[(rate, name)], slo, p.itl_slo_ms / 1e3),
                         "goodput_req_per_s": round(sum(r["goodput_req_per_s"] for r in per)
                                                    / len(per), 3),
                         "slo_attainment": round(sum(r["slo_attainment"] for r in per)
                                                 / len(per), 4),
                         "output_tok_per_s": round(sum(r["output_tok_per_s"] for r in per)
                                                   / len(per), 1),
                         "steps": steps, "mean_step_ms": round(
                             1e3 * sum(r["busy_s"] for r in per) / max(1, steps), 2),
                         "preemptions": sum(r["preemptions"] for r in per), "repeats": per})
    return rows


