"""One TP rank / PP stage: owns its KV range on its own device and applies page decisions.

The coordinator decides; each worker only applies (seed 001 §7). :class:`WorkerState` is the
worker's side of the protocol as a pure state machine: :meth:`WorkerState.handle` takes a message
dict and returns a reply dict, so the same code runs behind SimPy processes and behind Unix
sockets. Messages (``op`` plus fields; every reply echoes ``seq`` and carries the device's
``free``/``total`` bytes):

============  ==========================  ==================================================
op            fields                      effect, reply ``state``
============  ==========================  ==================================================
``map``       ``pages``                   back each page all-or-nothing; ``newly_mapped``
``unmap``     ``pages``                   unmap and release at once (map rollback, local mode)
``prepare``   ``txid, pages, commit``     unmap, retain handles → ``prepared`` (``committed``
                                          when ``commit`` folds phase two in)
``commit``    ``txid``                    release retained handles → ``committed`` (idempotent)
``abort``     ``txid``                    remap retained handles → ``aborted`` (remembered
                                          when it comes before its prepare)
``barrier``   ``epoch``                   wait for queued device work → ``epoch``
``state``                                 mapped, retained, pending txid, quarantined pages
============  ==========================  ==================================================

Messages are typed (:mod:`workbench.core.messages`); :meth:`WorkerState.handle` is the JSON
boundary (a decoded JSON object in, a JSON object out) and :meth:`WorkerState.apply` the typed core.
Errors are replies, never exceptions: ``status="error"`` with an
:class:`~workbench.core.messages.ErrorType`: ``device`` (nothing changed), ``map_quarantined`` (a
local rollback failed), ``busy`` (an unmap transaction is pending: every other map/unmap is
refused until it commits or aborts), ``aborted`` (a prepare or commit for a transaction already
aborted), ``not_prepared`` (a commit for a txid this worker never prepared; the txid is fenced so
a late prepare cannot reopen it), ``state_consistency`` (the worker's backing is unknown; it
refuses further work) and ``bad_request`` (a message that is not a well-formed request of a
known op, or names a page outside the range).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from workbench.core.device import Device
from workbench.core.geometry import KVGeometry
from workbench.core.messages import (
    AbortRequest,
    BarrierRequest,
    CommitRequest,
    ErrorType,
    MapRequest,
    PrepareRequest,
    Reply,
    Request,
    UnmapRequest,
    decode_request,
    echo_of,
)
from workbench.core.vspace import KVSpace
from workbench.errors import (
    DeviceError,
    MapQuarantinedError,
    ProtocolError,
    StateConsistencyError,
    WorkbenchError,
)

E = ErrorType

MAX_FINALIZED = 64  # finalized txids remembered (kvcached keeps the same number)
COMMITTED, ABORTED = "committed", "aborted"


@dataclass(slots=True)
class Txn:
    txid: str
    pages: list[int]


@dataclass(slots=True)
class WorkerState:
    """The worker side of map/unmap/prepare/commit/abort/barrier for one pool on one device."""

    geometry: KVGeometry
    device: Device
    name: str = "w0"
    space: KVSpace = field(init=False)
    pending: Txn | None = None
    finalized: OrderedDict[str, str] = field(default_factory=OrderedDict)
    quarantined: set[int] = field(default_factory=set)
    failed: str | None = None
    last_epoch: int = -1
    closed: bool = False

    def __post_init__(self) -> None:
        self.space = KVSpace(self.geometry, self.device)

    # -- entry point -------------------------------------------------------------------------
    def handle(self, msg: Any) -> dict[str, Any]:
        """The JSON boundary: a decoded JSON object in, the reply's JSON object out. A message
        that is not a well-formed request is answered with ``bad_request``, never raised."""
        try:
            req = decode_request(msg)
        except ProtocolError as err:
            op, seq = echo_of(msg)
            return self._stamp(Reply.error(E.BAD_REQUEST, str(err), op=op, seq=seq)).to_json()
        return self.apply(req).to_json()

    def apply(self, req: Request) -> Reply:
        """The typed core: one request, one reply (stamped with seq, worker and memory)."""
        fn = getattr(self, f"_op_{req.op}", None)
        if fn is None:
            reply = Reply.error(E.BAD_REQUEST, f"unknown op {req.op!r}")
        elif self.failed and req.op not in ("state", "ping", "close"):
            reply = Reply.error(E.STATE_CONSISTENCY, f"{self.name} has failed: {self.failed}")
        elif self.closed and req.op not in ("state", "ping", "close"):
            reply = Reply.error(E.BAD_REQUEST, f"{self.name} is closed")
        else:
            try:
                reply = fn(req)
            except ProtocolError as err:  # a well-typed request this worker cannot honour
                reply = Reply.error(E.BAD_REQUEST, str(err))
            except WorkbenchError as err:  # not foreseen by the handler: the backing is unknown
                reply = self._fail(f"{req.op}: {err}")
        reply.op, reply.seq = req.op, req.seq
        return self._stamp(reply)

    def _stamp(self, reply: Reply) -> Reply:
        reply.worker = self.name
        try:
            free, total = self.device.mem_info()
            reply.free, reply.total = int(free), int(total)
        except DeviceError:
            pass
        held = getattr(self.device, "held_bytes", None)  # what this process holds, if known
        if held is not None:
            reply.held = int(held)
        return reply

    def _fail(self, why: str) -> Reply:
        self.failed = self.failed or why
        return Reply.error(E.STATE_CONSISTENCY, why)

    def _busy(self) -> Reply | None:
        if self.pending is None:
            return None
        return Reply.error(E.BUSY, f"another unmap transaction is pending ({self.pending.txid})")

    def _pages(self, pages: list[int]) -> list[int]:
        """The request's pages, checked before any state is touched."""
        last = self.geometry.num_pages - 1
        for p in pages:
            if not 0 <= p <= last:
                raise ProtocolError(f"page {p}", f"this pool's pages are 0..{last}",
                                    "send a page id of this pool")
        if len(set(pages)) != len(pages):
            raise ProtocolError(f"pages {pages}", "a page id appears twice",
                                "send each page id once")
        return list(pages)

    def _finalize(self, txid: str, outcome: str) -> None:
        self.finalized[txid] = outcome
        self.finalized.move_to_end(txid)
        while len(self.finalized) > MAX_FINALIZED:
            self.finalized.popitem(last=False)

    # -- map / unmap -------------------------------------------------------------------------
    def _op_map(self, req: MapRequest) -> Reply:
        pages = self._pages(req.pages)
        if busy := self._busy():
            return busy
        space, new = self.space, []
        for page in pages:
            if page in self.quarantined or page in space.retained:
                return self._undo_map(new, Reply.error(
                    E.DEVICE, f"page {page} cannot be mapped here (quarantined or retained)"))
            if space.is_mapped(page):
                continue  # all-mapped offsets are skipped: a repeated map is harmless
            try:
                space.map_page(page)
            except MapQuarantinedError as err:
                self.quarantined.add(page)
                return self._undo_map(new, Reply.error(E.MAP_QUARANTINED, str(err),
                                                       quarantined=[page]))
            except DeviceError as err:
                return self._undo_map(new, Reply.error(E.DEVICE, str(err)))
            new.append(page)
        return Reply.ok(newly_mapped=new)

    def _undo_map(self, new: list[int], reply: Reply) -> Reply:
        """Unmap, newest first, what this call mapped; pages whose undo fails are quarantined."""
        left = []
        for page in reversed(new):
            try:
                self.space.unmap_page(page)
            except (DeviceError, StateConsistencyError):
                self.quarantined.add(page)
                left.append(page)
        reply.newly_mapped = left
        if left:
            reply.error_type = E.MAP_QUARANTINED
            reply.quarantined = (reply.quarantined or []) + left
        return reply

    def _op_unmap(self, req: UnmapRequest) -> Reply:
        pages = self._pages(req.pages)
        if busy := self._busy():
            return busy
        for page in pages:
            if not self.space.is_mapped(page):
                continue  # already gone: the rollback's goal is met
            try:
                self.space.unmap_page(page)
            except DeviceError as err:  # KVSpace put the page back whole
                return Reply.error(E.DEVICE, str(err))
            except StateConsistencyError as err:
                self.quarantined.add(page)
                return Reply.error(E.MAP_QUARANTINED, str(err), quarantined=[page])
        return Reply.ok()

    # -- transactional unmap -----------------------------------------------------------------
    def _op_prepare(self, req: PrepareRequest) -> Reply:
        txid, pages, commit = req.txid, self._pages(req.pages), req.commit
        done = self.finalized.get(txid)
        if done == ABORTED:
            return Reply.error(E.ABORTED, f"transaction {txid} was aborted; a late prepare cannot "
                                   "reopen it")
        if done == COMMITTED:
            return Reply.ok(state=COMMITTED)
        if self.pending is not None:
            if self.pending.txid == txid:
                return self._op_commit(req) if commit else Reply.ok(state="prepared")
            return self._busy() or Reply.ok(state="prepared")  # (pending: always busy)
        missing = [p for p in pages if not self.space.is_mapped(p)]
        if missing:
            self._finalize(txid, ABORTED)
            return Reply.error(E.STATE_CONSISTENCY,
                               f"pages {missing} are not mapped on {self.name}")
        done_pages: list[int] = []
        for page in pages:
            try:
                self.space.prepare_unmap(page)
            except DeviceError as err:  # this page is whole again; restore the earlier ones
                try:
                    for p in reversed(done_pages):
                        self.space.abort_unmap(p)
                except StateConsistencyError as undo:
                    return self._fail(f"prepare {txid}: {err}; restore failed: {undo}")
                self._finalize(txid, ABORTED)
                return Reply.error(E.DEVICE, f"prepare {txid}: {err}")
            except StateConsistencyError as err:
                return self._fail(f"prepare {txid}: {err}")
            done_pages.append(page)
        self.pending = Txn(txid, pages)
        if commit:
            return self._op_commit(req)
        return Reply.ok(state="prepared")

    def _op_commit(self, req: CommitRequest | PrepareRequest) -> Reply:
        txid = req.txid
        done = self.finalized.get(txid)
        if done == COMMITTED:
            return Reply.ok(state=COMMITTED)
        if done == ABORTED:
            return Reply.error(E.ABORTED, f"commit of aborted transaction {txid}")
        if self.pending is None or self.pending.txid != txid:
            self._finalize(txid, ABORTED)  # fence: a prepare still in flight is refused later
            return Reply.error(E.NOT_PREPARED, f"transaction {txid} was never prepared here")
        for page in self.pending.pages:
            try:
                self.space.commit_unmap(page)
            except StateConsistencyError as err:
                self.quarantined.add(page)
                return self._fail(f"commit {txid}: {err}")
        self.pending = None
        self._finalize(txid, COMMITTED)
        return Reply.ok(state=COMMITTED)

    def _op_abort(self, req: AbortRequest) -> Reply:
        txid = req.txid
        done = self.finalized.get(txid)
        if done == COMMITTED:
            return self._fail(f"abort of committed transaction {txid}")
        if done == ABORTED:
            return Reply.ok(state=ABORTED)
        if self.pending is None or self.pending.txid != txid:
            self._finalize(txid, ABORTED)  # abort before prepare: remembered
            return Reply.ok(state=ABORTED, early=True)
        for page in reversed(self.pending.pages):
            try:
                self.space.abort_unmap(page)
            except StateConsistencyError as err:
                self.quarantined.add(page)
                return self._fail(f"abort {txid}: {err}")
        self.pending = None
        self._finalize(txid, ABORTED)
        return Reply.ok(state=ABORTED)

    # -- barrier, state, lifecycle -----------------------------------------------------------
    def _op_barrier(self, req: BarrierRequest) -> Reply:
        epoch = req.epoch
        sync = getattr(self.device, "synchronize", None)
        if callable(sync):  # queued GPU work may still read retired pages
            sync()
        self.last_epoch = max(self.last_epoch, epoch)
        return Reply.ok(epoch=epoch)

    def _op_ping(self, req: Request) -> Reply:
        return Reply.ok()

    def _op_state(self, req: Request) -> Reply:
        return Reply.ok(mapped=sorted(self.space.handles), retained=sorted(self.space.retained),
                   pending=self.pending.txid if self.pending else None,
                   quarantined=sorted(self.quarantined), failed=self.failed,
                   epoch=self.last_epoch)

    def _op_close(self, req: Request) -> Reply:
        if not self.closed:
            self.close()
        return Reply.ok()

    def close(self) -> None:
        """Give every mapping and the reservation back (shutdown)."""
        self.closed = True
        self.pending = None
        try:
            self.space.close()
        except (DeviceError, StateConsistencyError) as err:
            self.failed = self.failed or f"close: {err}"

    def mapped(self) -> set[int]:
        return set(self.space.handles)
