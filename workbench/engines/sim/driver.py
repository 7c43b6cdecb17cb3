"""The SimPy driver: runs any :class:`Scheduler` against simulated time.

One process per engine instance loops ``schedule -> step -> update``. A step costs

* its host part (:class:`StepCost` ``cpu_s``) plus every VMM call the scheduler made while
  planning and updating (the device charges them to ``busy_s``; kvcached maps inline on the
  scheduler's path when the reserve is empty, and unmaps inline when a page empties);
* its GPU part, while holding the shared ``gpu`` resource: co-located instances time-slice one GPU
  at step granularity (a real GPU interleaves kernels of several contexts at a finer grain, with a
  similar total throughput).

The reserve pool is refilled by :class:`workbench.sim.prealloc.PreallocProcess` (kvcached's
prealloc thread), so only a miss of the reserve puts map latency on the step. Arrivals wake an
idle engine; an engine that has work but cannot schedule any (no KV) polls every ``idle_poll_s``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

import simpy

from workbench.core.events import PageState as S
from workbench.core.ledger import KVCacheManager
from workbench.engines.metrics import MemorySample
from workbench.engines.sched.request import Request
from workbench.engines.sched.scheduler import Scheduler
from workbench.engines.sim.steptime import StepTimeModel
from workbench.errors import ConfigError
from workbench.sim.device import SimDevice
from workbench.sim.prealloc import PreallocProcess

HOST_MODES = ("parallel", "serial", "one_thread")


class EngineDriver:
    """``host`` says what a step's host part shares with the other engines on the GPU:
    ``parallel`` (each engine its own thread: the host part overlaps their GPU steps), ``serial``
    (one host thread: the host part also holds the GPU turn) or ``one_thread`` (serial, and the
    engine schedules only once its turn comes, so a request that arrived while another engine
    stepped joins this step: the mini engine's colocation driver)."""

    def __init__(self, env: simpy.Environment, scheduler: Scheduler, steptime: StepTimeModel,
                 device: SimDevice, kv: KVCacheManager, *, gpu: simpy.Resource | None = None,
                 idle_poll_s: float = 0.005, background_refill: bool = True,
                 host: str = "parallel", async_scheduling: bool = False):
        if host not in HOST_MODES:
            raise ConfigError(f"host={host!r}", "is not a driver mode",
                              f"use one of {', '.join(HOST_MODES)}")
        self.host = host
        self.env = env
        self.sched = scheduler
        self.steptime = steptime
        self.device = device
        self.kv = kv
        self.gpu = gpu
        self.idle_poll_s = idle_poll_s
        self.name = scheduler.name
        self._wake: simpy.Event = env.event()
        self.prealloc: PreallocProcess | None = None
        self.busy_s = 0.0  # simulated seconds this engine spent in steps
        self.vmm_s = 0.0  # of which: VMM calls on the step path
        self.steps = 0
        self.connector = None  # a KV tier connector: load before a step, save after a prefill
        # async scheduling (vLLM V1's default): step N+1 is planned as soon as step N is
        # launched, so a request arriving while N runs joins N+2, not N+1 (see _admit)
        self.async_scheduling = async_scheduling
        self._held: list[Request] = []
        self._launched = 0.0  # when the step now ending was planned (its launch)
        self._rng = random.Random(f"{steptime.noise_seed}/{self.name}") if steptime.noise_sd \
            else None
        env.process(self._loop())
        if background_refill and kv.config.prealloc:
            self.prealloc = PreallocProcess(env, kv)

    # -- arrivals ----------------------------------------------------------------------------
    def submit(self, requests: Iterable[Request]) -> None:
        """Schedule ``requests`` to arrive at their ``arrival`` times (sorted or not)."""
        self.env.process(self._arrivals(sorted(requests, key=lambda r: (r.arrival, r.rid))))

    def _arrivals(self, reqs: list[Request]):
        env = self.env
        for r in reqs:
            if r.arrival > env.now:
                yield env.timeout(r.arrival - env.now)
            if self.async_scheduling:
                self._held.append(r)
            else:
                self.sched.add_request(r)
            if not self._wake.triggered:
                self._wake.succeed()

    # -- the step loop -----------------------------------------------------------------------
    def _loop(self):
        if self.gpu is not None and self.host == "one_thread":
            yield from self._loop_one_thread()
            return
        env, sched, dev, st = self.env, self.sched, self.device, self.steptime
        carry = 0.0  # VMM time from the last update (unmaps on free)
        while True:
            self._admit()
            if not sched.has_work():
                self._wake = env.event()
                yield self._wake
                self._admit()
            t0 = dev.busy_s
            plan = sched.schedule()
            self._launched = env.now
            vmm = dev.busy_s - t0 + carry
            if not plan.items:
                carry = vmm
                yield env.timeout(self.idle_poll_s)
                continue
            now = env.now
            for r, _ in plan.items:
                if r.first_scheduled is not None and r.first_scheduled < 0:
                    r.first_scheduled = now
            cost = st.cost(plan.num_seqs, plan.new_tokens, plan.ctx_tokens, plan.attn_pairs)
            cpu_s, gpu_s = cost.cpu_s, cost.gpu_s
            if self._rng is not None:
                k = math.exp(self._rng.gauss(0.0, st.noise_sd))
                cpu_s, gpu_s = cpu_s * k, gpu_s * k
            if self.host != "parallel":  # one host thread: its part of the step holds the turn
                cpu_s, gpu_s = 0.0, cpu_s + gpu_s
            load = self.connector.take_load_s() if self.connector is not None else 0.0
            yield env.timeout(cpu_s + vmm + load)
            if self.gpu is not None:
                with self.gpu.request() as slot:
                    yield slot
                    # the GPU passing from another process's context to this one costs time
                    if st.gpu_switch_s and getattr(self.gpu, "holder", self) is not self:
                        gpu_s += st.gpu_switch_s
                    self.gpu.holder = self
                    yield env.timeout(gpu_s)
            else:
                yield env.timeout(gpu_s)
            t1 = dev.busy_s
            sched.update(plan, env.now)
            carry = dev.busy_s - t1
            if self.connector is not None:  # the prompt's KV is saved once its prefill is done
                carry += self.connector.saved(r for r, _ in plan.items if r.first_token == env.now
                                              and r.output_len == 1)
            self.vmm_s += vmm
            self.busy_s += env.now - now
            self.steps += 1


    def _admit(self) -> None:
        """Hand held arrivals to the scheduler: under async scheduling only those that arrived
        before the step now ending was launched (the next step was planned then); an idle
        engine takes every arrival at once."""
        if not self._held:
            return
        idle = not self.sched.has_work()
        cut = self.env.now if idle else self._launched
        ready = [r for r in self._held if r.arrival <= cut]
        self._held = [r for r in self._held if r.arrival > cut]
        for r in ready:
            self.sched.add_request(r)

    def _loop_one_thread(self):
        """The step loop with ``host="one_thread"``: schedule and run the whole step (host and
        GPU time, VMM calls) while holding the GPU slot."""
        env, sched, dev, st = self.env, self.sched, self.device, self.steptime
        while True:
            if not sched.has_work():
                self._wake = env.event()
                yield self._wake
            with self.gpu.request() as slot:
                yield slot
                t0 = dev.busy_s
                plan = sched.schedule()
                vmm = dev.busy_s - t0
                if plan.items:
                    now = env.now
                    for r, _ in plan.items:
                        if r.first_scheduled is not None and r.first_scheduled < 0:
                            r.first_scheduled = now
                    cost = st.cost(plan.num_seqs, plan.new_tokens, plan.ctx_tokens,
                                   plan.attn_pairs)
                    yield env.timeout(cost.cpu_s + cost.gpu_s + vmm)
                    t1 = dev.busy_s
                    sched.update(plan, env.now)
                    vmm += dev.busy_s - t1  # unmaps on free: the same thread, before it lets go
                    yield env.timeout(dev.busy_s - t1)
                    self.vmm_s += vmm
                    self.busy_s += env.now - now
                    self.steps += 1
            if not plan.items:
                yield env.timeout(self.idle_poll_s)


def sample_memory(env: simpy.Environment, pools: dict[str, KVCacheManager], out: list,
                  every_s: float = 0.5, until: float | None = None):
    """A SimPy process appending one :class:`MemorySample` per pool every ``every_s``."""
    while until is None or env.now <= until:
        for name, kv in pools.items():
            c = kv.pages.counts
            out.append(MemorySample(env.now, name, kv.mapped_bytes,
                                    c[S.RESERVED] * kv.geometry.page_id_bytes,
                                    kv.used_blocks))
        yield env.timeout(every_s)
