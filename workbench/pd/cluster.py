"""The SimPy driver of PD disaggregation (seed 003 E7) and its colocated control, at the same
GPU count, every instance on its own simulated GPU.

* **colocated**: ``prefill + decode`` vLLM-like instances, requests dealt round-robin; every
  instance runs chunked prefills and decodes in the same steps (a decode step carries chunks);
* **pd**: ``prefill`` instances run each prompt only (``max_new_tokens=1``, their token is not
  shown to the user); when a prompt's prefill finishes, its KV (all prompt tokens but the last,
  :func:`~workbench.pd.link.handover_tokens`) crosses the link, queueing for a channel; then a
  ``decode`` instance admits the request once its pool has room, computes the last prompt token,
  samples the first output token (the user's TTFT) and decodes the rest.

Simplifications, stated so nobody reads more into the numbers: the prefill side frees its blocks
when its prefill finishes (a real connector keeps them pinned until the transfer completes; the
prefill pools here never run short, so it does not change the latencies), and the KV lands in a
staging area before the decode instance allocates its blocks (a real connector allocates the
destination first, then pulls). The transfer-faults lab models pins and landing blocks exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import simpy

from workbench.engines.metrics import SLO
from workbench.engines.models import get_model
from workbench.engines.sched.request import ReqState, Request
from workbench.engines.sched.vllm_sched import VLLMScheduler
from workbench.engines.sim.kvsetup import static_pool
from workbench.engines.sim.steptime import GPUS, StepTimeModel
from workbench.engines.sim.vllm_like import VLLMLikeEngine, VLLMOptions
from workbench.errors import ConfigError
from workbench.pd.link import LinkSpec, handover_tokens, kv_bytes
from workbench.units import GiB


@dataclass(slots=True)
class PDConfig:
    prefill: int = 1  # prefill instances (GPUs) in PD; colocated uses prefill + decode instances
    decode: int = 1
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    gpu_memory_utilization: float = 0.9
    activation_gib: float = 2.2
    link: LinkSpec = field(default_factory=LinkSpec)
    vllm: VLLMOptions = field(default_factory=VLLMOptions)  # both sides and colocated alike
    slo: SLO = SLO()

    @property
    def gpus(self) -> int:
        return self.prefill + self.decode


class Handover(NamedTuple):
    rid: int
    prefilled: float  # the prefill instance sampled (and dropped) its token
    sent: float  # a link channel was free: the transfer started
    landed: float  # the last byte arrived
    nbytes: int


class InstanceUse(NamedTuple):
    name: str
    role: str  # "colocated" | "prefill" | "decode"
    steps: int
    busy_s: float  # simulated seconds in steps
    mixed_steps: int  # steps that carried a decode and a prefill chunk (> 1 token) together
    chunk_tokens: int  # prompt tokens computed in chunks of more than one token


class ServeResult(NamedTuple):
    mode: str  # "colocated" | "pd"
    requests: list[Request]  # what the user sees (the decode side's copies in PD)
    handovers: dict[int, Handover]
    prefill_copies: dict[int, Request]
    instances: list[InstanceUse]
    sim_s: float
    wall_s: float


class ObservedScheduler(VLLMScheduler):
    """vLLM's scheduler, counting what its steps carry, and telling the PD driver when a
    request finishes (a prefill instance's request finishes when its prompt is computed)."""

    on_finished: Callable[[Request], None] | None = None
    mixed_steps = 0
    chunk_tokens = 0

    def schedule(self):
        plan = super().schedule()
        chunks = sum(n for _, n in plan.items if n > 1)
        self.chunk_tokens += chunks
        if chunks and any(n == 1 and r.output_len > 0 for r, n in plan.items):
            self.mixed_steps += 1
        return plan

    def release(self, req: Request, finished: bool) -> None:
        super().release(req, finished)
        if finished and self.on_finished is not None:
            self.on_finished(req)


class ObservedEngine(VLLMLikeEngine):
    def _scheduler(self) -> VLLMScheduler:
        s = super()._scheduler()
        s.__class__ = ObservedScheduler  # same state, two observing hooks
        return s


def _use(e: ObservedEngine, role: str) -> InstanceUse:
    s = e.scheduler
    return InstanceUse(e.name, role, e.driver.steps, e.driver.busy_s, s.mixed_steps,
                       s.chunk_tokens)


def _instance(env: simpy.Environment, cfg: PDConfig, name: str, cls=ObservedEngine):
    spec = get_model(cfg.model)
    if cfg.gpu not in GPUS:
        raise ConfigError(f"gpu {cfg.gpu!r}", "has no preset", f"use one of {', '.join(GPUS)}")
    kv_bytes_ = int(cfg.gpu_memory_utilization * GPUS[cfg.gpu].memory_bytes) - \
        spec.weight_bytes - int(cfg.activation_gib * GiB)
    ikv = static_pool(spec, kv_bytes_, name=name, env=env)
    return cls(env, name, ikv, StepTimeModel.preset(spec, cfg.gpu), options=cfg.vllm)


def _run_until_done(env: simpy.Environment, outstanding: Callable[[], int]) -> None:
    def watch():
        while outstanding():
            yield env.timeout(0.05)

    env.run(until=env.process(watch()))


def run_colocated(cfg: PDConfig, requests: list[Request]) -> ServeResult:
    """``cfg.gpus`` ordinary instances, requests dealt round-robin in arrival order."""
    wall0 = time.perf_counter()
    env = simpy.Environment()
    engines = [_instance(env, cfg, f"colo{i}") for i in range(cfg.gpus)]
    order = sorted(requests, key=lambda r: (r.arrival, r.rid))
    for i, eng in enumerate(engines):
        eng.submit(order[i::len(engines)])
    _run_until_done(env, lambda: sum(e.has_work() for e in engines))
    use = [_use(e, "colocated") for e in engines]
    return ServeResult("colocated", requests, {}, {}, use, env.now,
                       time.perf_counter() - wall0)


def run_pd(cfg: PDConfig, requests: list[Request]) -> ServeResult:
    """Prefill instances hand each prompt's KV over the link to decode instances."""
    if cfg.prefill < 1 or cfg.decode < 1:
        raise ConfigError(f"{cfg.prefill}P:{cfg.decode}D", "PD needs both sides",
                          "use at least one prefill and one decode instance")
    wall0 = time.perf_counter()
    env = simpy.Environment()
    model = get_model(cfg.model)
    pre = [_instance(env, cfg, f"prefill{i}") for i in range(cfg.prefill)]
    dec = [_instance(env, cfg, f"decode{i}") for i in range(cfg.decode)]
    link = simpy.Resource(env, capacity=cfg.link.channels)
    originals = {r.rid: r for r in requests}
    handovers: dict[int, Handover] = {}
    copies: dict[int, Request] = {}

    def transfer(p: Request):
        done = env.now
        nbytes = kv_bytes(model, handover_tokens(p.prompt_len))
        with link.request() as channel:
            yield channel
            sent = env.now
            yield env.timeout(cfg.link.transfer_s(nbytes))
        handovers[p.rid] = Handover(p.rid, done, sent, env.now, nbytes)
        d = originals[p.rid]
        d.num_computed = handover_tokens(p.prompt_len)  # the landed KV: only the tail is left
        dec[p.rid % len(dec)].submit([d])  # arrival is in the past: admitted at once

    for e in pre:
        e.scheduler.on_finished = lambda p: env.process(transfer(p))
    order = sorted(requests, key=lambda r: (r.arrival, r.rid))
    for i, r in enumerate(order):
        r.num_computed = 0
        p = Request(r.rid, list(r.prompt), 1, r.arrival, r.group)
        copies[r.rid] = p
        pre[i % len(pre)].submit([p])
    _run_until_done(env, lambda: sum(r.finish is None and r.state is not ReqState.REJECTED
                                     for r in requests))
    use = [_use(e, "prefill") for e in pre] + [_use(e, "decode") for e in dec]
    return ServeResult("pd", requests, handovers, copies, use, env.now,
                       time.perf_counter() - wall0)
