"""Serving metrics (seed 000 §14, seed 003 §3, §12): latency percentiles, throughput, goodput,
scheduler counters and the memory timeline.

Definitions: TTFT = first token - arrival (queueing included); TPOT = (finish - first token) /
(output tokens - 1); ITL = gaps between consecutive tokens of a request (a preempted request's
gap includes its recompute); E2E = finish - arrival. Goodput counts finished requests that meet
*both* SLO bounds, per second of the run's span (first arrival to last finish).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from workbench.engines.sched.request import ReqState, Request


class MemorySample(NamedTuple):
    t: float
    instance: str
    mapped_bytes: int
    reserved_bytes: int
    used_blocks: int


class Dist(NamedTuple):
    mean: float
    p50: float
    p95: float
    p99: float
    n: int

    @classmethod
    def of(cls, xs: Sequence[float] | np.ndarray) -> Dist:
        a = np.asarray(xs, dtype=float)
        if a.size == 0:
            nan = float("nan")
            return cls(nan, nan, nan, nan, 0)
        p50, p95, p99 = np.percentile(a, [50, 95, 99])
        return cls(float(a.mean()), float(p50), float(p95), float(p99), int(a.size))


class SLO(NamedTuple):
    ttft_s: float = 1.0
    tpot_s: float = 0.1

    def describe(self) -> str:
        return f"TTFT <= {self.ttft_s * 1e3:.0f} ms and TPOT <= {self.tpot_s * 1e3:.0f} ms"


class Summary(NamedTuple):
    requests: int
    finished: int
    rejected: int
    ttft: Dist
    tpot: Dist
    itl: Dist
    e2e: Dist
    span_s: float
    req_per_s: float
    input_tok_per_s: float
    output_tok_per_s: float
    slo: SLO
    goodput_req_per_s: float
    slo_attainment: float
    preemptions: int
    preempted_requests: int
    prefix_hit_tokens: int
    prefix_hit_requests: int
    prompt_tokens: int

    def as_dict(self) -> dict:
        d = self._asdict()
        for k in ("ttft", "tpot", "itl", "e2e", "slo"):
            d[k] = d[k]._asdict()
        return d


def summarize(requests: Iterable[Request], slo: SLO | None = None,
              with_itl: bool = True) -> Summary:
    slo = slo or SLO()
    reqs = list(requests)
    done = [r for r in reqs if r.state is ReqState.FINISHED]
    rejected = sum(1 for r in reqs if r.state is ReqState.REJECTED)
    ttft = np.array([r.first_token - r.arrival for r in done])
    e2e = np.array([r.finish - r.arrival for r in done])
    tpot = np.array([(r.finish - r.first_token) / (r.output_len - 1) for r in done
                     if r.output_len > 1])
    itl = (np.concatenate([np.diff(r.token_times) for r in done if len(r.token_times) > 1])
           if with_itl and any(len(r.token_times) > 1 for r in done) else np.array([]))
    if done:
        span = max(r.finish for r in done) - min(r.arrival for r in reqs)
    else:
        span = 0.0
    span = span or float("nan")
    good = [r for r in done if r.first_token - r.arrival <= slo.ttft_s and
            (r.output_len <= 1 or (r.finish - r.first_token) / (r.output_len - 1) <= slo.tpot_s)]
    return Summary(
        requests=len(reqs), finished=len(done), rejected=rejected,
        ttft=Dist.of(ttft), tpot=Dist.of(tpot), itl=Dist.of(itl), e2e=Dist.of(e2e),
        span_s=float(span), req_per_s=len(done) / span,
        input_tok_per_s=sum(r.prompt_len for r in done) / span,
        output_tok_per_s=sum(r.output_len for r in done) / span,
        slo=slo, goodput_req_per_s=len(good) / span,
        slo_attainment=len(good) / len(done) if done else float("nan"),
        preemptions=sum(r.preemptions for r in reqs),
        preempted_requests=sum(1 for r in reqs if r.preemptions),
        prefix_hit_tokens=sum(r.prefix_hit_tokens for r in reqs),
        prefix_hit_requests=sum(1 for r in reqs if r.prefix_hit_tokens),
        prompt_tokens=sum(r.prompt_len for r in reqs))


def memory_by_instance(samples: Iterable[MemorySample]) -> dict[str, dict[str, list]]:
    """Timeline columns per instance: ``{name: {"t": [...], "mapped": [...], ...}}``."""
    out: dict[str, dict[str, list]] = {}
    for s in samples:
        d = out.setdefault(s.instance, {"t": [], "mapped_bytes": [], "reserved_bytes": [],
                                        "used_blocks": []})
        d["t"].append(s.t)
        d["mapped_bytes"].append(s.mapped_bytes)
        d["reserved_bytes"].append(s.reserved_bytes)
        d["used_blocks"].append(s.used_blocks)
    return out
