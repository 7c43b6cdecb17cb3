"""Limit requests from another process (``workbench kvctl limit``), each answered to its sender.

A request is ``(limit, revision, request id)``, written under ``flock`` into the pool's segment:
the revision is one past every revision the segment has seen, the id is random and names this
caller's request alone. The owner applies the newest request on its next poll and writes back
``(ack revision, ack id, ack outcome)``. Two callers racing each get their own answer:

- **acknowledged** -- the owner applied this request (``applied`` or ``deferred``), and it is the
  limit in force when the caller looks;
- **superseded** -- a later request (its revision and id are named) replaced this one, before or
  after the owner applied it;
- **refused** -- the owner answered this request ``stale``, ``conflict`` or ``rejected``;
- **pending** -- no answer within the wait: the request stays written, the owner applies it on its
  next allocation or free.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from dataclasses import dataclass

from workbench.core.control import SegmentInfo, read_segment
from workbench.core.segment import (
    MAX_FIELD,
    OUTCOMES,
    open_checked,
    owner_alive,
    put_field,
    read_fd,
    segment_path,
    try_flock,
)
from workbench.errors import ControlError
from workbench.units import MiB, align_down

ACKNOWLEDGED, SUPERSEDED, REFUSED, PENDING = "acknowledged", "superseded", "refused", "pending"
LOCK_WAIT_S = 2.0


@dataclass(slots=True)
class LimitAnswer:
    """The owner's answer to one request, as its sender sees it."""
    pool: str
    requested: int
    revision: int
    request_id: int
    answer: str
    outcome: str  # the owner's outcome for this request (or the one that replaced it)
    superseded_by_revision: int | None
    superseded_by_request: int | None
    info: SegmentInfo

    def to_dict(self) -> dict:
        return {"pool": self.pool, "requested": self.requested, "revision": self.revision,
                "request_id": f"{self.request_id:016x}", "answer": self.answer,
                "acknowledged": self.answer == ACKNOWLEDGED,
                "outcome": self.outcome if self.answer != PENDING else PENDING,
                "superseded_by": None if self.superseded_by_revision is None else {
                    "revision": self.superseded_by_revision,
                    "request_id": f"{self.superseded_by_request:016x}"},
                "limit": self.info.limit, "mapped": self.info.mapped}


def _check(name: str, limit: int, info: SegmentInfo | None) -> SegmentInfo:
    # names are checked (letters, digits, _-.), so they print bare: no "'x''s" doubled quote
    if info is None:
        raise ControlError(f"no pool named {name} on this machine. Fix: use a name from "
                           f"`workbench kvctl list`")
    page = _exact(info.page_id_bytes)
    if limit < 0:
        raise ControlError(f"limit {limit} bytes is negative. Fix: ask for at least {page}")
    if limit > info.capacity:
        raise ControlError(f"limit {_exact(limit)} exceeds pool {name}'s capacity "
                           f"({_exact(info.capacity)}). Fix: ask for at most "
                           f"{_exact(info.capacity)}")
    if limit < info.page_id_bytes:
        raise ControlError(f"limit {_exact(limit)} is below one page id ({page}); the null "
                           f"block lives on page 0. Fix: ask for at least {page}")
    if limit % info.page_id_bytes:  # never rounded in silence: the caller picks the page id
        down = align_down(limit, info.page_id_bytes)
        up = min(down + info.page_id_bytes, info.capacity)
        raise ControlError(f"limit {_exact(limit)} is not a whole number of page ids "
                           f"({page} each): the pool would keep "
                           f"{_exact(down)}. Fix: ask for {_exact(down)} or {_exact(up)}")
    if not info.alive:
        raise ControlError(f"pool {name}'s owner (pid {info.owner_pid}) is gone. Fix: run "
                           f"`workbench kvctl gc` to remove its segment")
    return info


def _exact(n: int) -> str:
    """A size as ``kvctl limit`` takes it back, exactly: ``2GiB``, ``24MiB``, else bytes."""
    if n and n % (1024 * MiB) == 0:
        return f"{n // (1024 * MiB)}GiB"
    return f"{n // MiB}MiB" if n and n % MiB == 0 else f"{n} bytes"


def _locked(name: str, write: bool):
    """Open the segment checked, take its lock (bounded wait), parse it: (fd, fields)."""
    opened = open_checked(segment_path(name), write=write)
    if opened is None:
        raise ControlError(f"pool {name} disappeared. Fix: see `workbench kvctl list`")
    fd, st = opened
    if not try_flock(fd, fcntl.LOCK_EX if write else fcntl.LOCK_SH, LOCK_WAIT_S):
        os.close(fd)
        raise ControlError(f"pool {name}'s segment stayed locked for {LOCK_WAIT_S} s by "
                           f"another process. Fix: retry")
    try:
        v, _ = read_fd(fd, st, str(segment_path(name)))
    except BaseException:
        os.close(fd)  # closing drops the lock too
        raise
    return fd, v


def _write(name: str, limit: int, rid: int) -> int:
    fd, v = _locked(name, write=True)
    try:
        rev = max(v["revision"], v["req_revision"], v["ack_revision"]) + 1
        if rev > MAX_FIELD:  # refused before the first byte is written: never half a request
            raise ControlError(f"pool {name!r} has used up its request revisions "
                               f"({rev - 1}); restart its owner")
        put_field(fd, "req_limit", limit)
        put_field(fd, "req_id", rid)
        put_field(fd, "req_revision", rev)  # written last: the owner keys on it
    finally:
        os.close(fd)
    return rev


def _ack(name: str) -> dict[str, int]:
    fd, v = _locked(name, write=False)  # the owner writes its answer under the lock
    os.close(fd)
    return v


def answer(name: str, limit: int, rev: int, rid: int, v: dict[str, int],
           info: SegmentInfo) -> LimitAnswer:
    """Decide what the owner's state ``v`` says to the sender of request ``(rev, rid)``."""
    def make(kind: str, outcome: str, by: tuple[int, int] | None = None) -> LimitAnswer:
        return LimitAnswer(name, limit, rev, rid, kind, outcome, by and by[0], by and by[1], info)

    ack_rev, ack_id, ack_outcome = v["ack_revision"], v["ack_id"], OUTCOMES[v["ack_outcome"]]
    if ack_rev < rev:
        return make(PENDING, PENDING)
    if ack_rev == rev and ack_id == rid:
        ok = ack_outcome in ("applied", "deferred")
        return make(ACKNOWLEDGED if ok else REFUSED, ack_outcome)
    if v["revision"] == rev and v["limit"] == limit:  # mine holds; a later one was refused
        return make(ACKNOWLEDGED, OUTCOMES[v["outcome"]])
    return make(SUPERSEDED, ack_outcome, (ack_rev, ack_id))


def request_limit(name: str, limit: int, *, wait_s: float = 2.0) -> LimitAnswer:
    """Validate (nothing is written on bad input), write the request, wait up to ``wait_s`` for
    the owner's answer, and return it."""
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise ControlError(f"limit {limit!r} is not a whole number of bytes")
    _check(name, limit, read_segment(name))
    rid = secrets.randbits(62) + 1
    rev = _write(name, limit, rid)
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        v = _ack(name)
        if v["ack_revision"] >= rev or time.monotonic() >= deadline:
            break
        if not owner_alive(v):
            raise ControlError(f"pool {name}'s owner (pid {v['owner_pid']}) died before it "
                               f"answered request revision {rev}")
        time.sleep(0.01)
    info = read_segment(name)
    if info is None:
        raise ControlError(f"pool {name} disappeared. Fix: see `workbench kvctl list`")
    return answer(name, limit, rev, rid, v, info)
