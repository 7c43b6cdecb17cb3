"""One simulated serving instance under an open-loop workload, and the latency rows the serving
labs (baseline, chunked-prefill, control-groups) report: TTFT/TPOT/ITL/E2E percentiles,
throughput, goodput, queueing, KV use (seed 003 §3, §12; seed 000 §14.1).

Throughput of a finite open-loop run is distorted by its start (an empty engine) and its drain
(the last requests finish after the last arrival). ``steady_ratio`` avoids both: requests
*finished* per second over the middle half of the arrival window, over requests *arrived* per
second in it. In a stable system the two match (what arrives, leaves); past saturation the
queue grows and the ratio falls below 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.engines.metrics import SLO, Dist, summarize
from workbench.engines.models import get_model
from workbench.engines.sched.request import ReqState, Request
from workbench.engines.sim.cluster import SIM_ENGINES
from workbench.engines.sim.kvsetup import elastic_pool, static_pool
from workbench.engines.sim.sglang_like import SGLangOptions
from workbench.engines.sim.steptime import GPUS, StepTimeModel
from workbench.engines.sim.vllm_like import VLLMOptions
from workbench.engines.sim.workloads import MIX_CLASSES, long_short_mix
from workbench.errors import ConfigError
from workbench.labs.kit.params import LONG_SHARE
from workbench.units import GiB

WORKLOADS = ("short", "long_in", "long_out", "mix")  # seed 003 E1's four loads


@dataclass(slots=True)
class InstanceSetup:
    """One instance: model, GPU preset, engine kind and how its KV memory is provided."""

    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    engine: str = "vllm"  # "vllm" | "sglang"
    kv: str = "static"  # "static": vLLM's own split; "elastic": a KVCacheD pool
    gpu_memory_utilization: float = 0.9
    activation_gib: float = 2.2
    pool: PoolConfig = field(default_factory=PoolConfig)
    vllm: VLLMOptions = field(default_factory=VLLMOptions)
    sglang: SGLangOptions = field(default_factory=SGLangOptions)
    slo: SLO = SLO()


def workload(kind: str, rate: float, num_requests: int, seed: int) -> list[Request]:
    """Seed 003 E1's loads: one class of :data:`MIX_CLASSES`, or all three in equal parts."""
    if kind == "mix":
        return long_short_mix(rate, num_requests, seed=seed)
    if kind not in MIX_CLASSES:
        raise ConfigError(f"workload {kind!r}", "is not a load of seed 003 E1",
                          f"use one of {', '.join(WORKLOADS)}")
    return long_short_mix(rate, num_requests, weights={kind: 1.0}, seed=seed)


def build(setup: InstanceSetup, env: simpy.Environment):
    spec = get_model(setup.model)
    mem = GPUS[setup.gpu].memory_bytes
    act = int(setup.activation_gib * GiB)
    if setup.kv == "static":
        kv_bytes = int(setup.gpu_memory_utilization * mem) - spec.weight_bytes - act
        ikv = static_pool(spec, kv_bytes, name=setup.engine, config=setup.pool, env=env)
    elif setup.kv == "elastic":
        dev = make_device("sim", preset=setup.gpu, env=env, capacity=mem)
        dev.occupy("weights+activations", spec.weight_bytes + act)
        ikv = elastic_pool(spec, dev, name=setup.engine, config=setup.pool)
    else:
        raise ConfigError(f"kv={setup.kv!r}", "is not a KV mode", "use static or elastic")
    st = StepTimeModel.preset(spec, setup.gpu)
    if setup.engine in SIM_ENGINES:  # the scheduler's engine and its options (setup.vllm, ...)
        return SIM_ENGINES[setup.engine](env, setup.engine, ikv, st,
                                         options=getattr(setup, setup.engine),
                                         sample_every_s=0.5)
    raise ConfigError(f"engine={setup.engine!r}", "is not a simulated engine",
                      "use vllm or sglang")


def run(setup: InstanceSetup, requests: list[Request]) -> dict[str, Any]:
    """Run ``requests`` to completion on one fresh instance; its row of measurements."""
    env = simpy.Environment()
    eng = build(setup, env)
    eng.submit(requests)
    eng.advance()
    row = latency_row(requests, setup.slo)
    used = [s.used_blocks for s in eng.memory_timeline()]
    kv = eng.kv
    row.update(preemptions=eng.scheduler.stats.preemptions,
               recomputed_tokens=eng.scheduler.stats.recomputed_tokens,
               peak_kv_use=round(max(used, default=0) / max(1, kv.geometry.num_blocks), 4),
               peak_mapped_bytes=max((s.mapped_bytes for s in eng.memory_timeline()),
                                     default=0),
               steps=eng.driver.steps, busy_s=round(eng.driver.busy_s, 4), sim_s=env.now)
    if hasattr(eng, "pool"):
        row["prefix_evicted_blocks"] = eng.pool.evicted_cap + eng.pool.evicted_lru
    return row


def _ms(d: Dist) -> dict[str, float]:
    return {k: round(getattr(d, k) * 1e3, 2) for k in ("p50", "p95", "p99", "mean")}


def latency_row(requests: list[Request], slo: SLO,
                select: Callable[[Request], bool] | None = None) -> dict[str, Any]:
    """Percentiles (ms), throughput, goodput and the steady-window ratio of ``requests``."""
    reqs = [r for r in requests if select is None or select(r)]
    s = summarize(reqs, slo)
    done = [r for r in reqs if r.state is ReqState.FINISHED]
    waits = [r.first_scheduled - r.arrival for r in done if r.first_scheduled is not None]
    return {"requests": s.requests, "finished": s.finished, "rejected": s.rejected,
            "ttft_ms": _ms(s.ttft), "tpot_ms": _ms(s.tpot), "itl_ms": _ms(s.itl),
            "e2e_ms": _ms(s.e2e), "queue_ms": _ms(Dist.of(waits)),
            "req_per_s": round(s.req_per_s, 3), "input_tok_per_s": round(s.input_tok_per_s, 1),
            "output_tok_per_s": round(s.output_tok_per_s, 1),
            "goodput_req_per_s": round(s.goodput_req_per_s, 3),
            "slo_attainment": round(s.slo_attainment, 4), "sent_req_per_s": sent_rate(reqs),
            "steady_ratio": steady_ratio(reqs), "prefix_hit_tokens": s.prefix_hit_tokens,
            "prompt_tokens": s.prompt_tokens}


def sent_rate(reqs: list[Request]) -> float:
    """The actual send rate: arrivals per second between the first and the last arrival."""
    t = sorted(r.arrival for r in reqs)
    return round((len(t) - 1) / (t[-1] - t[0]), 3) if len(t) > 1 and t[-1] > t[0] else 0.0


def steady_ratio(reqs: list[Request]) -> float:
    """Finished / arrived per second over the middle half of the arrival window."""
    t = np.sort([r.arrival for r in reqs])
    if len(t) < 8:
        return float("nan")
    lo, hi = t[len(t) // 4], t[3 * len(t) // 4]
    arrived = int(np.sum((t >= lo) & (t < hi)))
    left = sum(1 for r in reqs if r.finish is not None and lo <= r.finish < hi)
    return round(left / arrived, 3) if arrived else float("nan")


LONG = "long_in"  # the long prompts; every other class is a decoding request


def mix(rate: float, n: int, long_share: float, seed: int) -> list[Request]:
    long_share = LONG_SHARE.check(long_share, "long_share=")  # the labs' declared range
    rest = (1.0 - long_share) / 2
    return long_short_mix(rate, n, weights={LONG: long_share, "short": rest, "long_out": rest},
                          seed=seed)
