"""The control segment: one POSIX shared-memory file per IPC name (``/dev/shm/wbkv_<name>``).

The owning pool publishes its state there; ``workbench kvctl`` (any other process) reads it and
writes limit *requests*. The owner applies a request on its next ``poll()`` (every alloc and free)
through the same revisioned ``set_limit`` as in-process callers, and acknowledges it.

Layout (little endian, versioned): a fixed header of int64 fields (below), then one byte per page
id holding its state code, so ``kvtop`` can draw the page map of a pool in another process.
The file is created with mode 0600 and ``O_EXCL``; writers take ``flock(LOCK_EX)``. The owner's
hot path reads only the request revision from the mapping (no system call) and writes counters.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.config import check_ipc_name
from workbench.core.events import Event, PageState
from workbench.errors import ConfigError, ControlError
from workbench.procs import pid_alive
from workbench.settings import settings

SHM_DIR = Path(settings(only="shm_dir").shm_dir)
PREFIX = "wbkv_"
MAGIC = b"WBKVSEG\x00"
VERSION = 1
FIELDS = ("owner_pid", "heartbeat_ns", "capacity", "page_id_bytes", "num_pages", "limit",
          "revision", "req_limit", "req_revision", "ack_revision", "outcome", "used",
          "reserved", "mapped", "used_blocks", "available_blocks", "block_size")
_HEAD = struct.Struct("<8sII")
_OFF = {name: _HEAD.size + 8 * i for i, name in enumerate(FIELDS)}
HEADER_SIZE = _HEAD.size + 8 * len(FIELDS)
OUTCOMES = ("applied", "deferred", "stale", "conflict", "rejected")
STATE_CODES = {s: i for i, s in enumerate(PageState)}
STATE_NAMES = list(PageState)


def segment_path(name: str) -> Path:
    return SHM_DIR / (PREFIX + check_ipc_name(name))


class _Mapped:
    """An open segment file and its mapping, with typed field access."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.mm = mmap.mmap(fd, size)

    def get(self, field: str) -> int:
        return struct.unpack_from("<q", self.mm, _OFF[field])[0]

    def put(self, field: str, value: int) -> None:
        struct.pack_into("<q", self.mm, _OFF[field], int(value))

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class ControlSegment:
    """The owner's side: created by a pool that has an IPC name."""

    def __init__(self, name: str, path: Path, seg: _Mapped, pool):
        self.name, self.path, self.seg, self.pool = name, path, seg, pool
        self._seen = 0
        self._unsubscribe = pool.events.subscribe(self._on_event, pool=pool.name)

    @classmethod
    def create(cls, name: str, pool) -> ControlSegment:
        path = segment_path(name)
        n = pool.geometry.num_pages
        size = HEADER_SIZE + n
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            info = read_segment(name)
            if info is not None and pid_alive(info.owner_pid):
                raise ConfigError(f"IPC name {name!r}",
                                  f"in use by live process {info.owner_pid}",
                                  "pick another name or stop that process") from None
            path.unlink(missing_ok=True)  # a dead owner's leftover: take the name over
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.fchmod(fd, 0o600)  # umask-proof
        os.ftruncate(fd, size)
        seg = _Mapped(fd, size)
        _HEAD.pack_into(seg.mm, 0, MAGIC, VERSION, HEADER_SIZE)
        seg.put("owner_pid", os.getpid())
        seg.put("capacity", pool.capacity_bytes)
        seg.put("page_id_bytes", pool.geometry.page_id_bytes)
        seg.put("num_pages", n)
        seg.put("block_size", pool.geometry.block_size)
        for page, st in enumerate(pool.pages.state):
            seg.mm[HEADER_SIZE + page] = STATE_CODES[st]
        self = cls(name, path, seg, pool)
        self.publish()
        return self

    def _on_event(self, e: Event) -> None:
        if e.page >= 0 and e.dst in PageState._value2member_map_:
            self.seg.mm[HEADER_SIZE + e.page] = STATE_CODES[PageState(e.dst)]

    def poll(self) -> None:
        """Apply a pending kvctl request, if any (cheap when none)."""
        rev = self.seg.get("req_revision")
        if rev <= self._seen:
            return
        fcntl.flock(self.seg.fd, fcntl.LOCK_SH)
        try:
            rev, limit = self.seg.get("req_revision"), self.seg.get("req_limit")
        finally:
            fcntl.flock(self.seg.fd, fcntl.LOCK_UN)
        self._seen = rev
        result = self.pool.set_limit(limit, revision=rev)
        self.seg.put("outcome", OUTCOMES.index(result.outcome.value))
        self.seg.put("ack_revision", rev)
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
        if p._pending is not None:
            put("outcome", OUTCOMES.index("deferred"))
        elif self.seg.get("outcome") == OUTCOMES.index("deferred"):
            put("outcome", 0)

    def close(self) -> None:
        self._unsubscribe()
        self.seg.close()
        # unlink only if the path still names our file (a successor may have taken the name)
        try:
            info = read_segment(self.name)
            if info is not None and info.owner_pid == os.getpid():
                self.path.unlink(missing_ok=True)
        except (ControlError, OSError):
            pass


# -- the reader/requester side (kvctl, kvtop) -------------------------------------------------
@dataclass(slots=True)
class SegmentInfo:
    name: str
    owner_pid: int
    alive: bool
    heartbeat_age_s: float
    capacity: int
    page_id_bytes: int
    num_pages: int
    limit: int
    revision: int
    req_limit: int
    req_revision: int
    ack_revision: int
    outcome: str
    used: int
    reserved: int
    mapped: int
    used_blocks: int
    block_size: int
    page_states: list[str]

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def _open(name: str, write: bool) -> _Mapped | None:
    path = segment_path(name)
    try:
        fd = os.open(path, os.O_RDWR if write else os.O_RDONLY)
    except FileNotFoundError:
        return None
    size = os.fstat(fd).st_size
    if size < HEADER_SIZE:
        os.close(fd)
        raise ControlError(f"segment {name!r} is truncated ({size} bytes)")
    seg = _Mapped.__new__(_Mapped)
    seg.fd = fd
    seg.mm = mmap.mmap(fd, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if write else 0))
    magic, version, _ = _HEAD.unpack_from(seg.mm, 0)
    if magic != MAGIC or version != VERSION:
        seg.close()
        raise ControlError(f"segment {name!r} is not a workbench segment of version {VERSION}")
    return seg


def read_segment(name: str) -> SegmentInfo | None:
    seg = _open(name, write=False)
    if seg is None:
        return None
    try:
        v = {f: seg.get(f) for f in FIELDS}
        n = v["num_pages"]
        codes = seg.mm[HEADER_SIZE:HEADER_SIZE + n]
        return SegmentInfo(
            name=name, owner_pid=v["owner_pid"], alive=pid_alive(v["owner_pid"]),
            heartbeat_age_s=max(0.0, (time.time_ns() - v["heartbeat_ns"]) / 1e9),
            capacity=v["capacity"], page_id_bytes=v["page_id_bytes"], num_pages=n,
            limit=v["limit"], revision=v["revision"], req_limit=v["req_limit"],
            req_revision=v["req_revision"], ack_revision=v["ack_revision"],
            outcome=OUTCOMES[v["outcome"]] if 0 <= v["outcome"] < len(OUTCOMES) else "?",
            used=v["used"], reserved=v["reserved"], mapped=v["mapped"],
            used_blocks=v["used_blocks"], block_size=v["block_size"],
            page_states=[STATE_NAMES[c].value if c < len(STATE_NAMES) else "?" for c in codes])
    finally:
        seg.close()


def list_segments() -> list[str]:
    if not SHM_DIR.is_dir():
        return []
    return sorted(p.name[len(PREFIX):] for p in SHM_DIR.iterdir() if p.name.startswith(PREFIX))


def read_all() -> list[SegmentInfo]:
    """Every readable workbench segment (foreign or truncated files are passed over)."""
    out = []
    for name in list_segments():
        try:
            info = read_segment(name)
        except (ControlError, ConfigError):
            continue
        if info is not None:
            out.append(info)
    return out


def request_limit(name: str, limit: int, *, wait_s: float = 2.0) -> SegmentInfo:
    """Write a limit request (validated first: nothing is written on bad input) and wait for the
    owner's acknowledgement. Returns the segment state after the wait."""
    info = read_segment(name)
    if info is None:
        raise ControlError(f"no pool named {name!r} (see `workbench kvctl list`)")
    if limit < 0:
        raise ControlError(f"limit {limit} is negative")
    if limit > info.capacity:
        raise ControlError(f"limit {limit} bytes exceeds pool {name!r}'s capacity "
                           f"({info.capacity} bytes)")
    if limit < info.page_id_bytes:
        raise ControlError(f"limit {limit} bytes is below one page id ({info.page_id_bytes} "
                           f"bytes); the null block lives on page 0")
    if not info.alive:
        raise ControlError(f"pool {name!r}'s owner (pid {info.owner_pid}) is gone; "
                           f"`workbench kvctl gc` removes its segment")
    seg = _open(name, write=True)
    if seg is None:
        raise ControlError(f"pool {name!r} disappeared")
    try:
        fcntl.flock(seg.fd, fcntl.LOCK_EX)
        try:
            rev = max(seg.get("revision"), seg.get("req_revision")) + 1
            seg.put("req_limit", limit)
            seg.put("req_revision", rev)  # written last: the owner keys on it
        finally:
            fcntl.flock(seg.fd, fcntl.LOCK_UN)
    finally:
        seg.close()
    deadline = time.monotonic() + wait_s
    while True:
        info = read_segment(name)
        if info is None or info.ack_revision >= rev or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    if info is None:
        raise ControlError(f"pool {name!r} disappeared")
    return info


def delete_segment(name: str, force: bool = False) -> None:
    info = read_segment(name)
    if info is None:
        raise ControlError(f"no pool named {name!r}")
    if info.alive and not force:
        raise ControlError(f"pool {name!r} is owned by live process {info.owner_pid}; "
                           f"pass --force to remove its segment anyway")
    segment_path(name).unlink(missing_ok=True)


def gc_segments() -> list[str]:
    """Remove segments whose owner process is gone; returns their names."""
    removed = []
    for name in list_segments():
        try:
            info = read_segment(name)
        except ControlError:
            info = None  # unreadable or foreign: leave it alone
            continue
        except OSError as err:
            if err.errno == errno.ENOENT:
                continue
            raise
        if info is not None and not info.alive:
            segment_path(name).unlink(missing_ok=True)
            removed.append(name)
    return removed
