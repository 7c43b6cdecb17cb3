"""The mini engine behind the :class:`~workbench.engines.base.Engine` protocol: requests with
arrival times on a wall clock, ``advance`` steps the engine, metrics and the pool's timeline.

The wrapped :class:`~workbench.mini.engine.Engine` keeps its own API (``add_request``, ``step``,
``generate``) for the server and the benchmarks; this class only adds the clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from workbench.core.events import PageState
from workbench.core.ledger import KVCacheManager
from workbench.engines.metrics import SLO, MemorySample, Summary, summarize
from workbench.engines.sched.request import Request
from workbench.mini.engine import Engine, Seq


class MiniInstance:
    """One mini engine on the wall clock ``clock() - t0`` (share ``t0`` between instances that
    run side by side, so their arrival times mean the same instant)."""

    kind = "mini"

    def __init__(self, engine: Engine, *, t0: float | None = None,
                 sample_every_s: float | None = 0.5,
                 clock: Callable[[], float] = time.perf_counter):
        self.engine = engine
        self.name = engine.kv.manager.name
        self._clock = clock
        self.t0 = clock() if t0 is None else t0
        self.sample_every_s = sample_every_s
        self._pending: list[Request] = []
        self.seqs: list[Seq] = []  # admitted, in admission order
        self.memory: list[MemorySample] = []
        self._next_sample = 0.0

    def now(self) -> float:
        return self._clock() - self.t0

    @property
    def kv_pool(self) -> KVCacheManager:
        return self.engine.kv.manager

    def submit(self, requests: Iterable[Request]) -> None:
        self._pending.extend(requests)
        self._pending.sort(key=lambda r: (r.arrival, r.rid))

    def has_work(self) -> bool:
        return bool(self._pending) or self.engine.has_work()

    def next_arrival(self) -> float | None:
        return self._pending[0].arrival if self._pending else None

    def _admit(self, now: float) -> None:
        k = 0
        while k < len(self._pending) and self._pending[k].arrival <= now:
            r = self._pending[k]
            self.seqs.append(self.engine.add_request(r.prompt, r.max_new_tokens,
                                                     arrival=self.t0 + r.arrival))
            k += 1
        del self._pending[:k]

    def advance(self, until: float | None = None) -> None:
        while True:
            self._admit(self.now())
            if self.engine.has_work():
                self.engine.step()
            elif self._pending and (until is None or self._pending[0].arrival < until):
                time.sleep(max(0.0, min(0.002, self._pending[0].arrival - self.now())))
            else:
                break
            self._sample()
            if until is not None and self.now() >= until:
                break

    def _sample(self) -> None:
        if self.sample_every_s is None:
            return
        now = self.now()
        if now < self._next_sample:
            return
        kv = self.kv_pool
        reserved = kv.pages.counts[PageState.RESERVED] * kv.geometry.page_id_bytes
        self.memory.append(MemorySample(now, self.name, kv.mapped_bytes, reserved,
                                        kv.used_blocks))
        self._next_sample = now + self.sample_every_s

    def metrics(self, slo: SLO | None = None) -> Summary:
        return summarize(self.seqs, slo)

    def memory_timeline(self) -> list[MemorySample]:
        return list(self.memory)
