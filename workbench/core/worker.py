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

Errors are replies, never exceptions: ``status="error"`` with ``error_type`` one of ``device``
(nothing changed), ``map_quarantined`` (a local rollback failed), ``busy`` (an unmap transaction
is pending: every other map/unmap is refused until it commits or aborts), ``aborted`` (a prepare
or commit for a transaction already aborted), ``not_prepared`` (a commit for a txid this worker
never prepared; the txid is fenced so a late prepare cannot reopen it), ``state_consistency``
(the worker's backing is unknown; it refuses further work) and ``bad_request``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from workbench.core.device import Device
from workbench.core.geometry import KVGeometry
from workbench.core.vspace import KVSpace
from workbench.errors import DeviceError, MapQuarantinedError, StateConsistencyError

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
    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        fn = getattr(self, f"_op_{op}", None) if isinstance(op, str) else None
        if fn is None:
            reply = _err("bad_request", f"unknown op {op!r}")
        elif self.failed and op not in ("state", "ping", "close"):
            reply = _err("state_consistency", f"{self.name} has failed: {self.failed}")
        elif self.closed and op not in ("state", "ping", "close"):
            reply = _err("bad_request", f"{self.name} is closed")
        else:
            try:
                reply = fn(msg)
            except (KeyError, TypeError, ValueError) as err:  # a malformed request
                reply = _err("bad_request", f"{op}: {err!r}")
        reply["op"] = op
        reply["seq"] = msg.get("seq")
        reply["worker"] = self.name
        try:
            free, total = self.device.mem_info()
            reply["free"], reply["total"] = int(free), int(total)
        except DeviceError:
            pass
        held = getattr(self.device, "held_bytes", None)  # what this process holds, if known
        if held is not None:
            reply["held"] = int(held)
        return reply

    def _fail(self, why: str) -> dict[str, Any]:
        self.failed = self.failed or why
        return _err("state_consistency", why)

    def _busy(self) -> dict[str, Any] | None:
        if self.pending is not None:
            return _err("busy", f"another unmap transaction is pending ({self.pending.txid})")
        return None

    def _pages(self, msg: dict[str, Any]) -> list[int]:
        pages = [int(p) for p in msg["pages"]]
        for p in pages:
            if not 0 <= p < self.geometry.num_pages:
                raise ValueError(f"page {p} outside 0..{self.geometry.num_pages - 1}")
        return pages

    def _finalize(self, txid: str, outcome: str) -> None:
        self.finalized[txid] = outcome
        self.finalized.move_to_end(txid)
        while len(self.finalized) > MAX_FINALIZED:
            self.finalized.popitem(last=False)

    # -- map / unmap -------------------------------------------------------------------------
    def _op_map(self, msg: dict[str, Any]) -> dict[str, Any]:
        pages = self._pages(msg)
        if busy := self._busy():
            return busy
        space, new = self.space, []
        for page in pages:
            if page in self.quarantined or page in space.retained:
                return self._undo_map(new, _err("device", f"page {page} cannot be mapped here "
                                                          "(quarantined or retained)"))
            if space.is_mapped(page):
                continue  # all-mapped offsets are skipped: a repeated map is harmless
            try:
                space.map_page(page)
            except MapQuarantinedError as err:
                self.quarantined.add(page)
                return self._undo_map(new, _err("map_quarantined", str(err), quarantined=[page]))
            except DeviceError as err:
                return self._undo_map(new, _err("device", str(err)))
            new.append(page)
        return _ok(newly_mapped=new)

    def _undo_map(self, new: list[int], reply: dict[str, Any]) -> dict[str, Any]:
        """Unmap, newest first, what this call mapped; pages whose undo fails are quarantined."""
        left = []
        for page in reversed(new):
            try:
                self.space.unmap_page(page)
            except (DeviceError, StateConsistencyError):
                self.quarantined.add(page)
                left.append(page)
        reply["newly_mapped"] = left
        if left:
            reply["error_type"] = "map_quarantined"
            reply.setdefault("quarantined", []).extend(left)
        return reply

    def _op_unmap(self, msg: dict[str, Any]) -> dict[str, Any]:
        pages = self._pages(msg)
        if busy := self._busy():
            return busy
        for page in pages:
            if not self.space.is_mapped(page):
                continue  # already gone: the rollback's goal is met
            try:
                self.space.unmap_page(page)
            except DeviceError as err:  # KVSpace put the page back whole
                return _err("device", str(err))
            except StateConsistencyError as err:
                self.quarantined.add(page)
                return _err("map_quarantined", str(err), quarantined=[page])
        return _ok()

    # -- transactional unmap -----------------------------------------------------------------
    def _op_prepare(self, msg: dict[str, Any]) -> dict[str, Any]:
        txid, pages, commit = str(msg["txid"]), self._pages(msg), bool(msg.get("commit"))
        done = self.finalized.get(txid)
        if done == ABORTED:
            return _err("aborted", f"transaction {txid} was aborted; a late prepare cannot "
                                   "reopen it")
        if done == COMMITTED:
            return _ok(state=COMMITTED)
        if self.pending is not None:
            if self.pending.txid == txid:
                return self._op_commit(msg) if commit else _ok(state="prepared")
            return self._busy() or {}
        missing = [p for p in pages if not self.space.is_mapped(p)]
        if missing:
            self._finalize(txid, ABORTED)
            return _err("state_consistency", f"pages {missing} are not mapped on {self.name}")
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
                return _err("device", f"prepare {txid}: {err}")
            except StateConsistencyError as err:
                return self._fail(f"prepare {txid}: {err}")
            done_pages.append(page)
        self.pending = Txn(txid, pages)
        if commit:
            return self._op_commit(msg)
        return _ok(state="prepared")

    def _op_commit(self, msg: dict[str, Any]) -> dict[str, Any]:
        txid = str(msg["txid"])
        done = self.finalized.get(txid)
        if done == COMMITTED:
            return _ok(state=COMMITTED)
        if done == ABORTED:
            return _err("aborted", f"commit of aborted transaction {txid}")
        if self.pending is None or self.pending.txid != txid:
            self._finalize(txid, ABORTED)  # fence: a prepare still in flight is refused later
            return _err("not_prepared", f"transaction {txid} was never prepared here")
        for page in self.pending.pages:
            try:
                self.space.commit_unmap(page)
            except StateConsistencyError as err:
                self.quarantined.add(page)
                return self._fail(f"commit {txid}: {err}")
        self.pending = None
        self._finalize(txid, COMMITTED)
        return _ok(state=COMMITTED)

    def _op_abort(self, msg: dict[str, Any]) -> dict[str, Any]:
        txid = str(msg["txid"])
        done = self.finalized.get(txid)
        if done == COMMITTED:
            return self._fail(f"abort of committed transaction {txid}")
        if done == ABORTED:
            return _ok(state=ABORTED)
        if self.pending is None or self.pending.txid != txid:
            self._finalize(txid, ABORTED)  # abort before prepare: remembered
            return _ok(state=ABORTED, early=True)
        for page in reversed(self.pending.pages):
            try:
                self.space.abort_unmap(page)
            except StateConsistencyError as err:
                self.quarantined.add(page)
                return self._fail(f"abort {txid}: {err}")
        self.pending = None
        self._finalize(txid, ABORTED)
        return _ok(state=ABORTED)

    # -- barrier, state, lifecycle -----------------------------------------------------------
    def _op_barrier(self, msg: dict[str, Any]) -> dict[str, Any]:
        epoch = int(msg["epoch"])
        sync = getattr(self.device, "synchronize", None)
        if callable(sync):  # queued GPU work may still read retired pages
            sync()
        self.last_epoch = max(self.last_epoch, epoch)
        return _ok(epoch=epoch)

    def _op_ping(self, msg: dict[str, Any]) -> dict[str, Any]:
        return _ok()

    def _op_state(self, msg: dict[str, Any]) -> dict[str, Any]:
        return _ok(mapped=sorted(self.space.handles), retained=sorted(self.space.retained),
                   pending=self.pending.txid if self.pending else None,
                   quarantined=sorted(self.quarantined), failed=self.failed,
                   epoch=self.last_epoch)

    def _op_close(self, msg: dict[str, Any]) -> dict[str, Any]:
        if not self.closed:
            self.close()
        return _ok()

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


def _ok(**fields: Any) -> dict[str, Any]:
    return {"status": "ok", **fields}


def _err(error_type: str, message: str, **fields: Any) -> dict[str, Any]:
    return {"status": "error", "error_type": error_type, "message": message, **fields}
