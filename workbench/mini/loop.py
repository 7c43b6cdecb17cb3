"""The one thread that owns the mini engine: it takes requests from an inbox, steps the engine
whenever there is work, and hands each token to the request's sink.

Servers talk to it only through :meth:`EngineLoop.submit`, :meth:`EngineLoop.cancel` and
:meth:`EngineLoop.call` (a function run on the engine thread, e.g. a prefix-cache reset). A sink
receives token ids, then ``None`` (finished) or an exception (refused, or the engine stopped);
exactly one of those two ends every request, so a caller that counts requests in flight can
release its slot there. After each iteration the loop publishes :class:`LoopGauges`, which other
threads read without touching the engine.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from workbench.errors import WorkbenchError
from workbench.mini.engine import Engine, Seq
from workbench.observe.metrics import PoolReading, reading_of_manager

log = logging.getLogger("workbench.mini")
Sink = Callable[[Any], None]  # token id, None (finished) or an Exception (refused / stopped)


class EngineStopped(WorkbenchError):
    """The engine thread ended (it crashed or was stopped); no request can be served."""


@dataclass(frozen=True, slots=True)
class LoopGauges:
    """What the engine holds, as of its last iteration."""

    waiting: int = 0  # requests queued for the engine (inbox and scheduler's waiting list)
    running: int = 0
    pool: PoolReading | None = None
    kv_usage: float = 0.0  # blocks held by requests / blocks in the pool (vLLM's usage)
    preemptions: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of those, found


class EngineLoop(threading.Thread):
    """Owns the engine. ``submit`` queues a request whose tokens go to ``sink``."""

    def __init__(self, engine: Engine, idle_wait_s: float = 0.02):
        super().__init__(name="mini-engine", daemon=True)
        self.engine = engine
        self.inbox: queue.Queue = queue.Queue()
        self.idle_wait_s = idle_wait_s
        self._halt = threading.Event()
        self._live: dict[str, Seq] = {}
        self.error: BaseException | None = None
        self.gauges = LoopGauges(pool=reading_of_manager(engine.kv.manager))

    def submit(self, prompt: list[int], max_tokens: int, sink: Sink, **kw: Any) -> str:
        rid = f"cmpl-{uuid.uuid4().hex[:16]}"
        self.inbox.put(("add", rid, prompt, max_tokens, kw, sink))
        return rid

    def cancel(self, rid: str) -> None:
        self.inbox.put(("cancel", rid))

    def stop(self) -> None:
        self._halt.set()
        self.inbox.put(("noop",))

    def call(self, fn: Callable[[Engine], Any]) -> Future:
        """Run ``fn(engine)`` on the engine thread between two steps (the engine is never
        touched from another thread); its result or error comes back in the Future."""
        fut: Future = Future()
        self.inbox.put(("call", fn, fut))
        return fut

    def _drain(self, block: bool) -> None:
        try:
            msg = self.inbox.get(timeout=self.idle_wait_s) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, msg: tuple) -> None:
        if msg[0] == "add":
            _, rid, prompt, max_tokens, kw, sink = msg

            def on_token(seq: Seq, tok: int | None, sink=sink) -> None:
                sink(tok)

            try:
                self._live[rid] = self.engine.add_request(prompt, max_tokens, rid=rid,
                                                          on_token=on_token, **kw)
            except WorkbenchError as err:  # the engine refused it (too long for the pool ...)
                sink(err)
        elif msg[0] == "call":
            _, fn, fut = msg
            try:
                fut.set_result(fn(self.engine))
            except Exception as err:  # the caller's answer, not the loop's end
                fut.set_exception(err)
        elif msg[0] == "cancel":
            seq = self._live.pop(msg[1], None)
            if seq is not None:
                self.engine.abort(seq, "abort")

    def _publish(self) -> None:
        eng = self.engine
        sched, pool, bs = eng.scheduler, eng.pool, eng.kv.geometry.block_size
        blocks = max(1, eng.kv.geometry.num_blocks - 1)  # block 0 is the null block
        self.gauges = LoopGauges(waiting=len(sched.waiting) + self.inbox.qsize(),
                                 running=len(sched.running),
                                 pool=reading_of_manager(eng.kv.manager),
                                 kv_usage=max(0.0, 1 - pool.num_free_blocks() / blocks),
                                 preemptions=eng.num_preemptions,
                                 prefix_queries=pool.queries * bs, prefix_hits=pool.hits * bs)

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self._drain(block=not self.engine.has_work())
                if not self.engine.has_work():  # busy, alloc and free poll it already
                    self.engine.kv.manager.poll_control()  # `kvctl limit` answered when idle
                if self.engine.has_work():
                    for seq in self.engine.step():
                        self._live.pop(seq.name, None)
                    if not self.engine.scheduler.running:
                        time.sleep(self.idle_wait_s)  # waiting for memory another pool holds
                self._publish()
        except Exception as err:  # a crash ends every open request with a 503, logged once
            self.error = err
            log.exception("the mini engine stopped; every open request is answered 503")
        finally:
            self._end_all()

    def _end_all(self) -> None:
        """End every request still open (running, or not yet taken from the inbox)."""
        why = EngineStopped(f"the engine stopped ({self.error!r}); restart `workbench serve`"
                            if self.error else "the server is shutting down")
        for seq in list(self._live.values()):
            if seq.on_token is not None and not seq.finished:
                seq.on_token(seq, why)
        self._live.clear()
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "add":
                msg[5](why)
