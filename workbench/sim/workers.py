"""Simulated TP/PP workers: SimPy processes, each with its own simulated GPU, behind a transport
with message latency and faults injectable at every protocol step.

A message's life has five steps, and a :class:`Fault` can hit each one for a chosen op, worker
and occurrence: the request is lost (``drop_request``) or late (``delay_request``); the worker
dies on receipt (``crash_before``) or after applying it (``crash_after``); the reply is lost
(``drop_reply``) or late (``delay_reply``). Device failures (a driver call that errors) come from
:class:`~workbench.core.device.FaultyDevice` plans per worker. A late message still arrives — after
the coordinator gave up on it — which is how the abort-before-prepare fence is exercised.

:class:`SimCluster` is a coordinator :class:`~workbench.core.coordinator.Transport`: ``exchange``
runs the SimPy environment until every reply is in or the timeout fires. Drive it from plain
code (not from inside a SimPy process). Messages travel as JSON, as on the real wire: a typed
request is written with ``to_json``, serialised, read back by the worker's JSON boundary
(:meth:`~workbench.core.worker.WorkerState.handle`), and its reply decoded into a typed
:class:`~workbench.core.messages.Reply` on arrival.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import simpy

from workbench.core.coordinator import Answer, TransportError, WorkerId, targets_for
from workbench.core.device import FaultyDevice
from workbench.core.geometry import KVGeometry
from workbench.core.messages import Request, StateRequest, reply_or_raw
from workbench.core.worker import WorkerState
from workbench.errors import ConfigError
from workbench.sim.device import SimDevice

FAULT_KINDS = ("drop_request", "delay_request", "crash_before", "crash_after", "drop_reply",
               "delay_reply")
PROTOCOL_OPS = ("map", "unmap", "prepare", "commit", "abort", "barrier", "state")


@dataclass(slots=True)
class Fault:
    """Hit the ``nth`` message of ``op`` (any op if None) to ``worker`` (any if None)."""

    kind: str
    op: str | None = None
    worker: WorkerId | None = None
    nth: int = 1
    delay: float = 1.0  # seconds added by delay_* (past the timeout: a late message)
    seen: int = 0
    fired: bool = False

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ConfigError(f"fault kind {self.kind!r}", f"not one of {', '.join(FAULT_KINDS)}",
                              "name a step of a message's life")


@dataclass(slots=True)
class SimWorker:
    wid: WorkerId
    state: WorkerState
    device: FaultyDevice
    inbox: simpy.Store
    alive: bool = True
    handled: list[str] = field(default_factory=list)


class SimCluster:
    """TP x PP simulated workers and the transport the coordinator talks through."""

    def __init__(self, geometry: KVGeometry, tp: int = 1, pp: int = 1, *,
                 env: simpy.Environment | None = None, preset: str = "h200",
                 latency: float = 20e-6, faults: Iterable[Fault] = (),
                 device_faults: Mapping[WorkerId, Mapping[str, Iterable[int]]] | None = None,
                 missing: Iterable[WorkerId] = (), capacity: int | None = None):
        self.env = env or simpy.Environment()
        self.geometry = geometry
        self.latency = latency
        self.faults = list(faults)
        self.injected: list[tuple[str, str | None, str]] = []  # (kind, op, worker)
        self.workers: dict[WorkerId, SimWorker] = {}
        skip = set(missing)
        for wid in targets_for(tp, pp):
            if wid in skip:
                continue  # no listener for this stage/rank
            dev = FaultyDevice(SimDevice(preset, env=self.env, capacity=capacity,
                                         name=f"sim-gpu-{wid.pp}-{wid.tp}"),
                               (device_faults or {}).get(wid))
            state = WorkerState(geometry, dev, name=str(wid))
            w = SimWorker(wid, state, dev, simpy.Store(self.env))
            self.workers[wid] = w
            self.env.process(self._serve(w))

    # -- Transport ---------------------------------------------------------------------------
    def now(self) -> float:
        return float(self.env.now)

    def check(self, targets: Iterable[WorkerId]) -> None:
        gone = [str(t) for t in targets if t not in self.workers]
        if gone:
            raise TransportError(f"no listener for {', '.join(gone)}: start those workers "
                                 "before the pool (nothing was sent)")

    def exchange(self, requests: Mapping[WorkerId, Request],
                 timeout: float) -> dict[WorkerId, Answer]:
        if not requests:
            return {}
        env, box, waiting = self.env, {}, set(requests)
        done = env.event()
        is_open = [True]

        def receiver(t: WorkerId) -> Callable[[dict[str, Any]], None]:
            def got(reply: dict[str, Any]) -> None:
                if is_open[0] and t in waiting:
                    box[t] = reply_or_raw(reply)
                    waiting.discard(t)
                    if not waiting and not done.triggered:
                        done.succeed()
            return got

        for t, msg in requests.items():
            env.process(self._deliver(t, _wire(msg.to_json()), receiver(t)))
        env.run(until=env.any_of([done, env.timeout(timeout)]))
        is_open[0] = False
        return {t: box.get(t) for t in requests}

    # -- message life ------------------------------------------------------------------------
    def _hit(self, kind: str, t: WorkerId, op: str | None) -> Fault | None:
        hit = None
        for f in self.faults:  # every matching fault counts the message; the first due fires
            if f.kind != kind or f.fired or (f.op is not None and f.op != op) or (
                    f.worker is not None and f.worker != t):
                continue
            f.seen += 1
            if f.seen == f.nth and hit is None:
                f.fired = True
                hit = f
        if hit is not None:
            self.injected.append((kind, op, str(t)))
        return hit

    def _deliver(self, t: WorkerId, msg: dict[str, Any], reply_to: Callable[[dict], None]):
        op = msg.get("op")
        if self._hit("drop_request", t, op):
            return
        late = self._hit("delay_request", t, op)
        yield self.env.timeout(self.latency + (late.delay if late else 0.0))
        w = self.workers.get(t)
        if w is not None and w.alive:
            yield w.inbox.put((msg, reply_to))

    def _serve(self, w: SimWorker):
        while True:
            msg, reply_to = yield w.inbox.get()
            if not w.alive:
                continue
            op = msg.get("op")
            if self._hit("crash_before", w.wid, op):
                self.crash(w.wid)
                continue
            before = w.device.busy_s
            reply = w.state.handle(msg)
            w.handled.append(str(op))
            yield self.env.timeout(w.device.busy_s - before)  # the device calls take time
            if self._hit("crash_after", w.wid, op):
                self.crash(w.wid)
                continue
            self.env.process(self._reply(w.wid, _wire(reply), reply_to))

    def _reply(self, t: WorkerId, reply: dict[str, Any], reply_to: Callable[[dict], None]):
        op = reply.get("op")
        if self._hit("drop_reply", t, op):
            return
        late = self._hit("delay_reply", t, op)
        yield self.env.timeout(self.latency + (late.delay if late else 0.0))
        reply_to(reply)

    # -- faults and inspection ---------------------------------------------------------------
    def crash(self, t: WorkerId) -> None:
        """The worker process dies: the driver frees its memory; its state is gone."""
        w = self.workers[t]
        w.alive = False
        inner = w.device.inner
        inner.mappings.clear()
        inner.allocations.clear()
        w.state.space.handles.clear()
        w.state.space.retained.clear()
        w.state.pending = None

    def settle(self, seconds: float = 10.0) -> None:
        """Let late messages arrive (advance simulated time)."""
        self.env.run(until=self.env.now + seconds)

    def states(self) -> dict[WorkerId, dict[str, Any]]:
        """Each worker's state read directly (no message); a dead worker holds nothing."""
        out = {}
        for t, w in self.workers.items():
            s = w.state.apply(StateRequest()).to_json()
            s["alive"] = w.alive
            out[t] = s
        return out

    def device_bytes(self, t: WorkerId) -> int:
        return sum(self.workers[t].device.inner.allocations.values())


def _wire(obj: dict[str, Any]) -> Any:
    """What the other end reads: the object serialised to JSON text and parsed back."""
    return json.loads(json.dumps(obj))
