"""The control segment: one POSIX shared-memory file per IPC name (``/dev/shm/wbkv_<name>``).

The owning pool publishes its state there; ``workbench kvctl`` (any other process) reads it and
writes limit *requests* (see :mod:`workbench.core.limit_requests`). The owner applies a request on
its next ``poll()`` (every alloc and free) through the same revisioned ``set_limit`` as in-process
callers, and answers it: which request (its id), which revision, what outcome.

A segment appears under its name only complete: the owner writes it as
``wbkvnew_<pid>_<start>_<token>_<name>`` and ``link``\\ s it into place (``O_EXCL`` semantics), so
an empty or half-written file under a segment's name was never one of ours; a crash mid-creation
leaves a ``wbkvnew_`` file whose name says whose it was, and ``gc`` (or the next owner of the
name) removes it once that process is gone. The file format and the reader's checks live in
:mod:`workbench.core.segment`. Liveness is the owner's pid *and* start time.
"""

from __future__ import annotations

import fcntl
import functools
import mmap
import os
import secrets
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbench import owned
from workbench.core.events import Event, PageState
from workbench.core.segment import (
    HEADER_SIZE,
    MALFORMED,
    MAX_PAGES,
    OFF,
    OTHER_VERSION,
    OUTCOMES,
    PARTIAL_PREFIX,
    PREFIX,
    SHM_DIR,
    UNREADABLE,
    SegmentRefused,
    check_stat,
    create_file,
    entry_name,
    foreign_header,
    owner_alive,
    partial_owner,
    read_checked,
    reserve_space,
    segment_path,
    try_flock,
    unlink_if_same,
)
from workbench.errors import ConfigError, ControlError
from workbench.procs import my_identity, pid_alive

__all__ = ["ControlSegment", "Scan", "SegmentInfo", "SegmentRefused", "delete_segment",
           "gc_segments", "list_segments", "read_all", "read_segment", "scan", "segment_path"]
STATE_CODES = {s: i for i, s in enumerate(PageState)}
STATE_NAMES = list(PageState)
HALF_WRITTEN = "half-written"
_Q = struct.Struct("<q")


class _Mapped:
    """The owner's own segment file and its mapping, with typed field access."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.mm = mmap.mmap(fd, size)
        # the field every poll reads (an engine polls per request per step): one bound call
        self.req_revision = functools.partial(_Q.unpack_from, self.mm, OFF["req_revision"])

    def get(self, name: str) -> int:
        return _Q.unpack_from(self.mm, OFF[name])[0]

    def put(self, name: str, value: int) -> None:
        _Q.pack_into(self.mm, OFF[name], int(value))

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class ControlSegment:
    """The owner's side: created by a pool that has an IPC name."""

    def __init__(self, name: str, path: Path, seg: _Mapped, pool):
        self.name, self.path, self.seg, self.pool = name, path, seg, pool
        self._seen = 0
        self._owned = 0  # the owned-registry token once the segment is in place
        self._unsubscribe = pool.events.subscribe(self._on_event, pool=pool.name)

    @classmethod
    def create(cls, name: str, pool) -> ControlSegment:
        path = segment_path(name)
        n = pool.geometry.num_pages
        if n > MAX_PAGES:
            raise ConfigError(f"pool {name!r}", f"{n} page ids exceed the segment's {MAX_PAGES}",
                              "use a larger page size")
        gc_segments(only=name)  # a crashed predecessor's half-written file
        pid, start = my_identity()
        tmp = SHM_DIR / f"{PARTIAL_PREFIX}{pid}_{start}_{secrets.token_hex(4)}_{name}"
        fd = create_file(tmp, name)
        mine = os.fstat(fd)  # the same inode under both names once linked

        def undo() -> None:  # a signal at any point from here on leaves neither name behind
            tmp.unlink(missing_ok=True)
            unlink_if_same(path, mine)

        token = owned.own(f"segment {path}", undo)
        seg = self = None
        try:
            os.fchmod(fd, 0o600)  # umask-proof
            reserve_space(fd, HEADER_SIZE + n, name, tmp.parent)
            seg = _Mapped(fd, HEADER_SIZE + n)
            g = pool.geometry
            for k, v in (("owner_pid", pid), ("owner_start", start), ("num_pages", n),
                         ("capacity", pool.capacity_bytes), ("block_size", g.block_size),
                         ("page_id_bytes", g.page_id_bytes)):
                seg.put(k, v)
            for page, st in enumerate(pool.pages.state):
                seg.mm[HEADER_SIZE + page] = STATE_CODES[st]
            self = cls(name, path, seg, pool)
            self.publish()
            _claim(tmp, path, name)
            self._owned = token
        except BaseException:
            owned.disown(token)
            if self is not None:
                self._unsubscribe()
            if seg is not None:
                seg.close()
            else:
                os.close(fd)
            raise
        finally:
            tmp.unlink(missing_ok=True)
        return self

    def _on_event(self, e: Event) -> None:
        if e.page >= 0 and e.dst in PageState._value2member_map_:
            self.seg.mm[HEADER_SIZE + e.page] = STATE_CODES[PageState(e.dst)]

    def poll(self) -> None:
        """Apply a pending kvctl request, if any (cheap when none), and answer it."""
        if self.seg.req_revision()[0] <= self._seen or not try_flock(self.seg.fd, fcntl.LOCK_SH):
            return  # nothing new, or a requester is writing: the next poll picks it up
        try:
            rev, limit, rid = (self.seg.get(k) for k in ("req_revision", "req_limit", "req_id"))
        finally:
            fcntl.flock(self.seg.fd, fcntl.LOCK_UN)
        self._seen = rev
        result = self.pool.set_limit(limit, revision=rev)
        try_flock(self.seg.fd, fcntl.LOCK_EX, 0.05)  # whole to readers; bounded: never stalls
        try:
            self.seg.put("ack_outcome", OUTCOMES.index(result.outcome.value))
            self.seg.put("ack_id", rid)
            self.seg.put("ack_revision", rev)
        finally:
            fcntl.flock(self.seg.fd, fcntl.LOCK_UN)
        self.publish()

    def publish(self) -> None:
        p, pages, g = self.pool, self.pool.pages, self.pool.geometry
        put = self.seg.put
        put("limit", p.limit_bytes)
        put("revision", p.revision)
        put("used", pages.counts[PageState.IN_USE] * g.page_id_bytes)
        put("reserved", pages.counts[PageState.RESERVED] * g.page_id_bytes)
        put("mapped", pages.mapped_pages * g.page_id_bytes)
        put("used_blocks", p.used_blocks)
        put("heartbeat_ns", time.time_ns())
        put("outcome", OUTCOMES.index("deferred" if p._pending is not None else "applied"))

    def close(self) -> None:
        self._unsubscribe()
        try:
            unlink_if_same(self.path, os.fstat(self.seg.fd))  # only if it is still ours
        finally:
            owned.disown(getattr(self, "_owned", 0))
            self.seg.close()


def _claim(tmp: Path, path: Path, name: str) -> None:
    """Link the finished segment ``tmp`` into place as ``path``; a dead owner's leftover is taken
    over, a live one or a foreign entry refused (and left alone)."""
    for _ in range(3):
        try:
            os.link(tmp, path)
            return
        except FileExistsError:
            pass
        try:
            got = read_checked(path)
        except SegmentRefused as err:
            raise ConfigError(f"IPC name {name!r}", f"{path} exists and is not a usable "
                              f"segment ({err.detail})", "remove it if it is yours, or pick "
                              "another name") from None
        if got is None:
            continue
        v, _, st = got
        if owner_alive(v):
            raise ConfigError(f"IPC name {name!r}", f"in use by live process {v['owner_pid']}",
                              "pick another name or stop that process")
        unlink_if_same(path, st)  # a dead owner's leftover: take the name over
    raise ConfigError(f"IPC name {name!r}", "other processes kept taking it while this one "
                      "claimed it", "retry, or pick another name")


# -- the reader side (kvctl, kvtop) -----------------------------------------------------------
@dataclass(slots=True)
class SegmentInfo:
    name: str
    owner_pid: int
    owner_start: int
    alive: bool
    heartbeat_age_s: float
    capacity: int
    page_id_bytes: int
    num_pages: int
    limit: int
    revision: int
    req_limit: int
    req_revision: int
    req_id: int
    ack_revision: int
    ack_id: int
    ack_outcome: str
    outcome: str
    used: int
    reserved: int
    mapped: int
    used_blocks: int
    block_size: int
    page_states: list[str]

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def of(cls, name: str, v: dict[str, int], codes: bytes) -> SegmentInfo:
        plain = {k: v[k] for k in cls.__slots__ if k in v and k not in ("outcome", "ack_outcome")}
        return cls(name=name, alive=owner_alive(v),
                   heartbeat_age_s=max(0.0, (time.time_ns() - v["heartbeat_ns"]) / 1e9),
                   outcome=OUTCOMES[v["outcome"]], ack_outcome=OUTCOMES[v["ack_outcome"]],
                   page_states=[STATE_NAMES[c].value if c < len(STATE_NAMES) else "?"
                                for c in codes], **plain)


@dataclass(slots=True)
class Scan:
    """What a look at the shared-memory directory found: the pools, and what it skipped."""
    infos: list[SegmentInfo] = field(default_factory=list)
    skipped: list[SegmentRefused] = field(default_factory=list)


def read_segment(name: str) -> SegmentInfo | None:
    """The segment of pool ``name``; None if there is none; :class:`SegmentRefused` if what is
    there is not a segment this workbench trusts."""
    got = read_checked(segment_path(name))
    return None if got is None else SegmentInfo.of(name, got[0], got[1])


def _entries() -> list[str]:
    try:
        return sorted(e for e in os.listdir(SHM_DIR) if e.startswith((PREFIX, PARTIAL_PREFIX)))
    except OSError:
        return []


def list_segments() -> list[str]:
    """The names of the segment entries (well-formed or not: reading tells)."""
    out = []
    for e in _entries():
        if e.startswith(PREFIX):
            try:
                out.append(entry_name(e))
            except SegmentRefused:
                continue
    return out


def _check_partial(entry: str) -> tuple[bool, os.stat_result]:
    """(alive, stat) for a ``wbkvnew_`` entry, or :class:`SegmentRefused`."""
    path = SHM_DIR / entry
    owner = partial_owner(entry)
    try:
        st = os.lstat(path)
    except OSError as err:
        raise SegmentRefused(path, UNREADABLE, f"cannot be examined ({err.strerror})") from None
    if owner is None:
        raise SegmentRefused(f"{SHM_DIR}/{ascii(entry)[1:-1]}", HALF_WRITTEN,
                             "named like a segment being written, but not by a workbench")
    check_stat(path, st)
    why, st = foreign_header(path, empty_ok=True)  # written from its first byte: magic or none
    if why is not None:
        raise SegmentRefused(path, MALFORMED, f"named like a segment being written, but {why}")
    return pid_alive(owner[0], owner[1] or None), st


def scan() -> Scan:
    """Every segment this workbench can trust, and one refusal for each entry it skipped."""
    out = Scan()
    for entry in _entries():
        try:
            if entry.startswith(PARTIAL_PREFIX):
                alive, _ = _check_partial(entry)
                if not alive:
                    raise SegmentRefused(SHM_DIR / entry, HALF_WRITTEN, "half-written by a "
                                         "process that is gone; `workbench kvctl gc` removes it")
                continue
            info = read_segment(entry_name(entry))
        except SegmentRefused as err:
            out.skipped.append(err)
            continue
        except OSError as err:
            out.skipped.append(SegmentRefused(SHM_DIR / entry, UNREADABLE, str(err.strerror)))
            continue
        if info is not None:
            out.infos.append(info)
    return out


def read_all() -> list[SegmentInfo]:
    """Every readable workbench segment (what :func:`scan` skipped is left out)."""
    return scan().infos


def delete_segment(name: str, force: bool = False) -> None:
    """Remove pool ``name``'s segment. Without ``force`` only a well-formed one whose owner is
    gone; with it also a live owner's, or one of ours this workbench cannot read (this user's
    regular file carrying the segment magic and header). Anything else is refused and left."""
    path = segment_path(name)
    try:
        got = read_checked(path)
    except SegmentRefused as err:
        if err.kind not in (MALFORMED, OTHER_VERSION):
            raise ControlError(f"{path} is not a segment this workbench can read: {err.detail}; "
                               f"left alone") from None
        why, st = foreign_header(path)
        if why is not None:
            raise ControlError(f"{path} is not a segment this workbench can read: {err.detail}; "
                               f"left alone, even with --force: {why}. Fix: remove it by hand "
                               f"if you know what it is") from None
        if not force:
            raise ControlError(f"{path} is not a segment this workbench can read: {err.detail}"
                               f". Fix: pass --force to remove it") from None
        if not unlink_if_same(path, st):
            raise ControlError(f"{path} changed while it was being removed; left alone. "
                               f"Fix: look again with `workbench kvctl list`") \
                from None
        return
    if got is None:
        raise ControlError(f"no pool named {name} on this machine. Fix: use a name from "
                           f"`workbench kvctl list`")
    v, _, st = got
    if owner_alive(v) and not force:
        raise ControlError(f"pool {name} is owned by live process {v['owner_pid']}. "
                           f"Fix: stop that process, or pass --force to remove its segment "
                           f"anyway")
    unlink_if_same(path, st)


def gc_segments(only: str | None = None, report: list[SegmentRefused] | None = None) -> list[str]:
    """Remove what provably belonged to a process that is gone: well-formed segments of this
    user whose owner (pid and start time) is dead, and half-written ``wbkvnew_`` files of dead
    creators (all of them, or those of the name ``only``). Everything else is left alone (and
    added to ``report``). Returns the entries removed (segment names; entry names for
    half-written files)."""
    removed = []
    for entry in _entries():
        if only is not None and entry != PREFIX + only and \
                (partial_owner(entry) or (0, 0, ""))[2] != only:
            continue
        try:
            if entry.startswith(PARTIAL_PREFIX):
                alive, st = _check_partial(entry)
                key = entry
            else:
                key = entry_name(entry)
                got = read_checked(SHM_DIR / entry)
                if got is None:
                    continue
                alive, st = owner_alive(got[0]), got[2]
        except SegmentRefused as err:
            if report is not None:
                report.append(err)
            continue
        if not alive and unlink_if_same(SHM_DIR / entry, st):
            removed.append(key)
    return removed
