"""The :class:`~workbench.engines.base.Engine` protocol for the simulated engines: a scheduler, its
KV (static or elastic, :mod:`workbench.engines.sim.kvsetup`) and its SimPy driver."""

from __future__ import annotations

from collections.abc import Iterable

import simpy

from workbench.core.ledger import KVCacheManager
from workbench.engines.metrics import SLO, MemorySample, Summary, summarize
from workbench.engines.sched.request import Request
from workbench.engines.sched.scheduler import Scheduler
from workbench.engines.sim.driver import EngineDriver, sample_memory
from workbench.engines.sim.kvsetup import InstanceKV
from workbench.engines.sim.steptime import StepTimeModel


class SimEngine:
    """One simulated instance; subclasses build the scheduler (``_scheduler``)."""

    kind = "sim"

    def __init__(self, env: simpy.Environment, name: str, ikv: InstanceKV,
                 steptime: StepTimeModel, *, gpu: simpy.Resource | None = None,
                 sample_every_s: float | None = None, host: str = "parallel"):
        self.env, self.name, self.ikv = env, name, ikv
        self.scheduler: Scheduler = self._scheduler()
        self.driver = EngineDriver(env, self.scheduler, steptime, ikv.kv.device, ikv.kv, gpu=gpu,
                                   host=host, async_scheduling=self._async_scheduling())
        self.submitted: list[Request] = []
        self.memory: list[MemorySample] = []
        if sample_every_s is not None:
            env.process(sample_memory(env, {name: ikv.kv}, self.memory, sample_every_s))

    def _async_scheduling(self) -> bool:
        return False

    def _scheduler(self) -> Scheduler:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def kv(self) -> KVCacheManager:
        return self.ikv.kv

    @property
    def kv_pool(self) -> KVCacheManager:
        return self.ikv.kv

    def submit(self, requests: Iterable[Request]) -> None:
        reqs = list(requests)
        self.submitted.extend(reqs)
        self.driver.submit(reqs)

    def has_work(self) -> bool:
        return len(self.scheduler.finished) < len(self.submitted)

    def advance(self, until: float | None = None) -> None:
        """Run the shared simulated clock to ``until`` (None: until this engine is done)."""
        if until is not None:
            if until > self.env.now:
                self.env.run(until=until)
            return
        env = self.env

        def watch():
            while self.has_work():
                yield env.timeout(0.25)

        env.run(until=env.process(watch()))

    def metrics(self, slo: SLO | None = None) -> Summary:
        return summarize(self.submitted, slo)

    def memory_timeline(self) -> list[MemorySample]:
        return list(self.memory)
