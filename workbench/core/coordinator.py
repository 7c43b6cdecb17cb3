"""TP/PP ownership: one decision, applied on every worker that owns a copy of the KV range.

vLLM-style (seed 001 §7): the scheduler process decides which page ids are backed; every TP rank
(and every PP stage when ``pp_rank = -1``) owns its own KV tensors on its own device and must
apply the same transition at the same offset. :class:`FanOutSpace` has the methods of
:class:`~workbench.core.vspace.KVSpace` that the page allocator uses, so
``KVCacheManager(geometry, space=FanOutSpace(...))`` runs the whole core across workers unchanged.

Guarantees (seed 000 §11–§12), per page id:

* **map is all-or-nothing.** If any target fails, the targets that succeeded unmap exactly what
  this call newly mapped. A failed rollback quarantines the page (``MapQuarantinedError``). An
  unknown outcome (lost reply, timeout, malformed reply, dead worker) fails the pool
  (``StateConsistencyError``): never a silent continue.
* **unmap is a transaction.** ``prepare`` (unmap, retain handles) on every target; all prepared →
  ``commit`` (release; idempotent; retried on targets still unconfirmed); otherwise ``abort``
  (remap) everywhere, including targets whose reply was lost, so a prepare still in flight is
  fenced. A single target folds prepare+commit into one round trip and answers an ambiguous
  reply with a retried commit, never an abort. Every failure is a typed error and an event.
* **async release.** Retired pages are released only after every target confirms its barrier.

SGLang-style local pools are the other mode: each rank owns its own pool and maps its own pages;
nothing is broadcast (:func:`local_pools`).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from workbench.core.device import MemInfo
from workbench.core.events import Event, EventLog
from workbench.core.geometry import KVGeometry
from workbench.core.links import Answer, FanOutDevice, Transport, TransportError
from workbench.core.messages import (
    FATAL,
    AbortRequest,
    BarrierRequest,
    CloseRequest,
    CommitRequest,
    ErrorType,
    MapRequest,
    PrepareRequest,
    Reply,
    Request,
    StateRequest,
    Status,
    UnmapRequest,
    WorkerId,
    reply_or_raw,
    targets_for,
)
from workbench.errors import (
    ConfigError,
    DeviceError,
    MapQuarantinedError,
    PoolFailedError,
    StateConsistencyError,
)

__all__ = ["Answer", "FanOutDevice", "FanOutSpace", "Transport", "TransportError", "WorkerId",
           "targets_for"]

class _Outcome(NamedTuple):
    ok: dict[WorkerId, Reply]
    failed: dict[WorkerId, Reply]  # an error reply: the worker knows what it did
    unknown: dict[WorkerId, str]  # no usable reply: the outcome there is unknown


class FanOutSpace:
    """Page backing applied on every target worker, with KVSpace's methods (see module doc)."""

    def __init__(self, geometry: KVGeometry, transport: Transport, targets: list[WorkerId], *,
                 pool: str = "pool", events: EventLog | None = None, timeout: float = 30.0,
                 commit_attempts: int = 2, granularity: int | None = None,
                 fold_single: bool = True):
        if not targets:
            raise ConfigError("FanOutSpace targets", "the list is empty, so no worker would "
                              "hold the pages", "pass targets_for(tp, pp) or another non-empty "
                              "list of WorkerId")
        self.geometry = geometry
        self.transport = transport
        self.targets = list(targets)
        self.pool = pool
        self.events = events if events is not None else EventLog()
        self.timeout = timeout
        self.commit_attempts = commit_attempts
        self.fold_single = fold_single
        self.device = FanOutDevice(f"fanout[{len(targets)}]", granularity or geometry.page_size,
                                   transport.now)
        self.mapped: set[int] = set()
        self.retained: dict[int, str] = {}  # page -> txid prepared everywhere, not committed
        self.quarantined: set[int] = set()
        self.failed: str | None = None
        self.size = geometry.virtual_bytes
        self._fail_hook: Callable[[str], None] | None = None
        self._seq = itertools.count(1)
        self._lock = threading.RLock()  # one transaction per pool at a time (state-gil case)
        self.round_trips = 0
        self.ping()

    # -- wiring ------------------------------------------------------------------------------
    def bind_allocator(self, allocator: Any) -> None:
        """Share the allocator's event log and make a failure here fail the allocator too."""
        self.events = allocator.events
        self.pool = allocator.pool
        self._fail_hook = allocator.fail

    @property
    def handles(self) -> dict[int, list[str]]:
        """Mapped page -> the targets that hold its backing (each worker holds its own handles)."""
        names = [str(t) for t in self.targets]
        return {p: names for p in sorted(self.mapped)}

    def is_mapped(self, page: int) -> bool:
        return page in self.mapped

    # -- plumbing ----------------------------------------------------------------------------
    def _emit(self, page: int, src: str, dst: str, cause: str) -> None:
        self.events.emit(Event(self.device.now(), self.pool, page, src, dst, cause))

    def check_ok(self) -> None:
        if self.failed is not None:
            raise PoolFailedError(f"pool {self.pool!r} has failed and refuses work: {self.failed}")

    def _fail(self, why: str) -> StateConsistencyError:
        if self.failed is None:
            self.failed = why
            if self._fail_hook is not None:
                self._fail_hook(why)
            else:
                self._emit(-1, "ok", "failed", why)
        return StateConsistencyError(f"pool {self.pool!r} failed: {why}")

    def _send(self, requests: Mapping[WorkerId, Request]) -> _Outcome:
        """One round trip to several targets, classified. TransportError (no listener) passes
        through: it is raised before anything is sent."""
        self.transport.check(requests)
        for msg in requests.values():
            msg.seq = next(self._seq)
        self.round_trips += 1
        try:
            replies = self.transport.exchange(requests, self.timeout)
        except TransportError:
            raise
        except Exception as err:  # noqa: BLE001 - whatever was sent, its outcome is unknown
            return _Outcome({}, {}, {t: f"transport raised {err!r}" for t in requests})
        out = _Outcome({}, {}, {})
        for t, msg in requests.items():
            self._classify(t, msg, replies.get(t), out)
        return out

    def _classify(self, t: WorkerId, msg: Request, raw: Answer, out: _Outcome) -> None:
        r = raw if raw is None or isinstance(raw, Reply) else reply_or_raw(raw)
        if r is None:
            out.unknown[t] = f"no reply to {msg.op} within {self.timeout:g}s"
            return
        if not isinstance(r, Reply) or r.seq != msg.seq or r.op != msg.op:
            out.unknown[t] = f"malformed reply to {msg.op}: {str(raw)[:120]}"
            return
        if r.status is Status.OK:
            out.ok[t] = r
        elif r.status is Status.UNDELIVERED:  # the listener is gone: so are its tensors
            out.failed[t] = dataclasses.replace(r, error_type=ErrorType.UNREACHABLE)
        else:
            out.failed[t] = r
        if r.free is not None and r.total is not None:
            self.device.info[t] = MemInfo(r.free, r.total)

    def _all(self, kind: type[Request], **fields: Any) -> dict[WorkerId, Request]:
        return {t: kind(**fields) for t in self.targets}

    @staticmethod
    def _fatal(out: _Outcome) -> bool:
        """A target whose state is unknown or gone (the pool cannot go on)."""
        return bool(out.unknown) or any(r.error_type in FATAL for r in out.failed.values())

    @staticmethod
    def _why(out: _Outcome) -> str:
        parts = [f"{t}: {r.error_type}: {r.message}" for t, r in out.failed.items()]
        parts += [f"{t}: {why}" for t, why in out.unknown.items()]
        return "; ".join(parts)

    # -- map ---------------------------------------------------------------------------------
    def map_page(self, page: int) -> None:
        """Back ``page`` on every target or on none (see module doc for the failure outcomes)."""
        with self._lock:
            self.check_ok()
            if page in self.mapped or page in self.retained or page in self.quarantined:
                raise StateConsistencyError(f"page {page} is already backed or quarantined")
            out = self._send(self._all(MapRequest, pages=[page]))
            if not out.failed and not out.unknown:
                self.mapped.add(page)
                return
            why = self._why(out)
            # roll back exactly what this call newly mapped, on the targets that said so
            undo: dict[WorkerId, Request] = {t: UnmapRequest(pages=r.newly_mapped)
                                             for t, r in out.ok.items() if r.newly_mapped}
            back = self._send(undo) if undo else _Outcome({}, {}, {})
            if self._fatal(out) or self._fatal(back):
                self._emit(page, "free", "unknown", f"map_unknown: {why} {self._why(back)}")
                raise self._fail(f"map of page {page}: outcome unknown ({why}"
                                 f"{'; rollback: ' + self._why(back) if back.unknown else ''})")
            bad = [t for t, r in out.failed.items() if r.error_type is ErrorType.MAP_QUARANTINED]
            bad += list(back.failed)
            if bad:
                self.quarantined.add(page)
                raise MapQuarantinedError(
                    f"page {page}: map failed ({why}); rollback left it unknown on "
                    f"{', '.join(map(str, bad))}: quarantined")
            self._emit(page, "free", "free", f"map_rollback: {why}; rolled back on "
                                             f"{', '.join(map(str, undo)) or 'no target'}")
            raise DeviceError("map", f"page {page}: {why}; every target rolled back")

    # -- unmap (transactional) ---------------------------------------------------------------
    def unmap_page(self, page: int) -> None:
        """Unmap and release ``page`` everywhere, as one transaction."""
        with self._lock:
            if len(self.targets) == 1 and self.fold_single:
                self._unmap_folded(page)
            else:
                self.prepare_unmap(page)
                self.commit_unmap(page)

    def _check_mapped(self, page: int) -> None:
        self.check_ok()
        if page not in self.mapped:
            raise StateConsistencyError(f"page {page} is not mapped (coordinator view)")

    def prepare_unmap(self, page: int) -> str:
        """Phase one on every target; returns the txid. Raises DeviceError when every target
        was aborted back to mapped (the page is whole), StateConsistencyError otherwise.

        With one target (and ``fold_single``) prepare carries the commit: one round trip, the
        page is released at once, the later ``commit_unmap`` is a no-op and abort is refused."""
        with self._lock:
            if len(self.targets) == 1 and self.fold_single:
                return self._unmap_folded(page)
            self._check_mapped(page)
            txid = uuid.uuid4().hex
            out = self._send(self._all(PrepareRequest, txid=txid, pages=[page]))
            if not out.failed and not out.unknown and all(
                    r.state == "prepared" for r in out.ok.values()):
                self.mapped.discard(page)
                self.retained[page] = txid
                return txid
            why = self._why(out) or "a target did not stay prepared"
            self._abort(page, txid, why)  # raises StateConsistencyError if the abort is unsure
            # a lost prepare reply is resolved by the abort; a failed or gone worker is not
            if any(r.error_type in FATAL for r in out.failed.values()):
                raise self._fail(f"prepare {txid} of page {page}: {why}")
            raise DeviceError("unmap", f"page {page}: prepare {txid} failed ({why}); aborted "
                                       "on every target, the page stays mapped")

    def _abort(self, page: int, txid: str, why: str) -> None:
        out = self._send(self._all(AbortRequest, txid=txid))
        if out.failed or out.unknown:
            self._emit(page, "mapped", "unknown", f"abort {txid} unsure: {self._why(out)}")
            raise self._fail(f"abort {txid} of page {page} after ({why}) is unsure: "
                             f"{self._why(out)}")
        self._emit(page, "mapped", "mapped", f"unmap_aborted {txid}: {why}")

    def commit_unmap(self, page: int) -> None:
        """Phase two: release on every target; retried where unconfirmed; idempotent."""
        with self._lock:
            txid = self.retained.get(page)
            if txid is None:
                return  # already committed
            self.check_ok()
            left = list(self.targets)
            why = ""
            for _ in range(self.commit_attempts):
                out = self._send({t: CommitRequest(txid=txid) for t in left})
                if out.failed:
                    self._emit(page, "retained", "unknown", f"commit {txid}: {self._why(out)}")
                    raise self._fail(f"commit {txid} of page {page}: {self._why(out)}")
                left = [t for t in left if t not in out.ok]
                why = self._why(out)
                if not left:
                    del self.retained[page]
                    return
            self._emit(page, "retained", "unknown", f"commit {txid} unconfirmed: {why}")
            raise self._fail(f"state_consistency_unknown: commit {txid} of page {page} "
                             f"unconfirmed on {', '.join(map(str, left))} after "
                             f"{self.commit_attempts} attempts ({why})")

    def abort_unmap(self, page: int) -> None:
        """Undo phase one everywhere: the page is mapped again."""
        with self._lock:
            if page not in self.retained:
                raise StateConsistencyError(f"page {page} has no prepared unmap to abort")
            txid = self.retained.pop(page)
            self._abort(page, txid, "abort requested")
            self.mapped.add(page)

    def _unmap_folded(self, page: int) -> str:
        """One target: prepare carries commit (one round trip). An ambiguous reply is answered
        with a retried commit, never an abort: the handles may already be released."""
        self._check_mapped(page)
        txid = uuid.uuid4().hex
        out = self._send(self._all(PrepareRequest, txid=txid, pages=[page], commit=True))
        for attempt in range(self.commit_attempts + 1):
            if out.ok and out.ok[self.targets[0]].state == "committed":
                self.mapped.discard(page)
                return txid
            if out.failed:
                r = next(iter(out.failed.values()))
                if r.error_type in (ErrorType.DEVICE, ErrorType.ABORTED, ErrorType.NOT_PREPARED):
                    # the worker restored the page or never saw the prepare (now fenced)
                    self._emit(page, "mapped", "mapped", f"unmap_aborted {txid}: "
                                                         f"{self._why(out)}")
                    raise DeviceError("unmap", f"page {page}: {self._why(out)}; the page stays "
                                               "mapped")
                self._emit(page, "mapped", "unknown", f"unmap {txid}: {self._why(out)}")
                raise self._fail(f"unmap {txid} of page {page}: {self._why(out)}")
            if attempt < self.commit_attempts:
                out = self._send(self._all(CommitRequest, txid=txid))
        self._emit(page, "mapped", "unknown", f"unmap {txid} unconfirmed: {self._why(out)}")
        raise self._fail(f"state_consistency_unknown: unmap {txid} of page {page} "
                         f"unconfirmed ({self._why(out)})")

    # -- async release barrier ---------------------------------------------------------------
    def barrier(self, epoch: int) -> bool:
        """True once every target confirmed it finished queued work through ``epoch``."""
        with self._lock:
            self.check_ok()
            out = self._send(self._all(BarrierRequest, epoch=epoch))
            done = not out.failed and not out.unknown and all(
                r.epoch == epoch for r in out.ok.values())
            if not done:
                self._emit(-1, f"barrier@{epoch}", "incomplete", self._why(out) or "epoch")
            return done

    def release_retired_through(self, owner: Any, marker: int) -> int:
        """Barrier for ``marker`` on every target, then ``owner.release_retired_through``.
        ``owner`` is a KVCacheManager or PageAllocator. Returns pages released (0 when a
        target has not confirmed: its retired pages stay mapped until a later barrier)."""
        if not self.barrier(marker):
            return 0
        return owner.release_retired_through(marker)

    # -- health and inspection ---------------------------------------------------------------
    def ping(self) -> dict[WorkerId, Reply]:
        """Ask every target for its state; an unreachable or failed target fails the pool (its
        tensors, or what we know of them, are gone)."""
        with self._lock:
            out = self._send(self._all(StateRequest))
            if out.unknown or out.failed:
                raise self._fail(f"health check: {self._why(out)}")
            bad = {t: r.failed for t, r in out.ok.items() if r.failed}
            if bad:
                raise self._fail(f"health check: worker failed: {bad}")
            return out.ok

    def inconsistencies(self, states: Mapping[WorkerId, Reply | Mapping[str, Any]]) -> list[str]:
        """Compare worker states (``state`` replies, typed or as JSON objects) with this view:
        each live page must be mapped on every target or none. Quarantined pages are exempt."""
        problems = []
        for t in self.targets:
            s = states[t]
            if isinstance(s, Reply):
                held = set(s.mapped or ()) | set(s.retained or ())
            else:
                held = set(s["mapped"]) | set(s["retained"])
            want = self.mapped | set(self.retained)
            for p in sorted((held ^ want) - self.quarantined):
                problems.append(f"page {p}: {'held' if p in held else 'missing'} on {t}")
        return problems

    def close(self) -> None:
        """Unmap what is still mapped (best effort) and close every worker's range."""
        with self._lock:
            if self.failed is None:
                for page in sorted(self.mapped):
                    try:
                        self.unmap_page(page)
                    except (DeviceError, StateConsistencyError):
                        break
            try:
                self._send(self._all(CloseRequest))
            except TransportError:
                pass
