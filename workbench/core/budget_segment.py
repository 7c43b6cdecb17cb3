"""One GPU's memory budget, shared by every process on it: a shared-memory file per device.

``<shm dir>/wbkvbudget_<device>`` holds a total and one slot per holder (pid, start time, bytes
held). A process charges a page's bytes before it creates physical memory and credits them after
it releases it; a charge that would take the sum of the slots past the total is refused (a miss).
Several engine processes on one GPU so share a fixed total that no one of them can over-commit.

Charging is one read-modify-write under ``flock(LOCK_EX)`` on the segment itself, chosen over
``fcntl`` record locks and over a separate lock file: a ``flock`` belongs to the open file
description, so the kernel drops it when its holder dies (a SIGKILL mid-charge never wedges the
GPU), closing some other descriptor of the file does not drop it (``lockf`` would), and there is
no second file to trust. Threads of one process share the descriptor, so a threading lock orders
them; a forked child reopens the file (an inherited descriptor would share the parent's lock).

A holder is its pid *and* start time (:mod:`workbench.procs`); one that is gone (pid gone, or
reused by a later process) has its slot reclaimed by the next charge that would otherwise miss,
by a process attaching, or by ``workbench kvctl budget --gc``; a dead creator's half-written
``wbkvbudnew_`` file by the next creation or by ``gc``. The file is created complete under
a temporary name and linked into place, and opened like a control segment (``O_NOFOLLOW``,
``fstat``: regular, ours); its bytes are read with ``pread`` and accepted only with the magic,
this version, the exact header and size, and in-range fields.

Layout (little endian, version 1): ``magic[8] version:u32 header_size:u32 total:i64
slots:i64 created_ns:i64``, then ``slots`` times ``pid:i64 start:i64 held:i64``.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from workbench.core import segment
from workbench.core.segment import SegmentRefused, open_checked, partial_owner, unlink_if_same
from workbench.errors import ConfigError
from workbench.names import check_name
from workbench.procs import my_identity, pid_alive, valid_pid
from workbench.terminal import plain

PREFIX = "wbkvbudget_"
PARTIAL_PREFIX = "wbkvbudnew_"
MAGIC = b"WBKVBUD\x00"
VERSION = 1
HEAD = struct.Struct("<8sIIqqq")
SLOT = struct.Struct("<qqq")
NUM_SLOTS = 64  # holders per GPU: processes, not pools (a process's pools share its slot)
MAX_SLOTS = 4096
MAX_TOTAL = 1 << 50
LOCK_TIMEOUT_S = 2.0  # a charge waits this long for a peer's read-modify-write, then misses


def budget_path(ident: str, shm_dir: Path | str | None = None) -> Path:
    return Path(shm_dir or segment.SHM_DIR) / (PREFIX + check_name(ident, "budget name"))


def file_size(slots: int) -> int:
    return HEAD.size + slots * SLOT.size


@dataclass(slots=True)
class Holder:
    pid: int
    start: int
    held: int
    alive: bool = True


@dataclass(slots=True)
class BudgetState:
    """A parsed budget: the total, the slots (index -> holder; empty slots left out)."""
    total: int
    slots: int
    created_ns: int
    holders: dict[int, Holder] = field(default_factory=dict)

    @property
    def held(self) -> int:
        return sum(h.held for h in self.holders.values())


def parse(data: bytes, where: str) -> BudgetState:
    """The budget in ``data``, or :class:`SegmentRefused`; total on every input."""
    if len(data) < HEAD.size:
        raise SegmentRefused(where, segment.MALFORMED, f"{len(data)} bytes, shorter than the "
                                                       f"{HEAD.size}-byte budget header")
    magic, version, hsize, total, slots, created = HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise SegmentRefused(where, segment.MALFORMED, "no budget magic: not a workbench budget")
    if version != VERSION:
        raise SegmentRefused(where, segment.OTHER_VERSION, f"budget version {version}; this "
                                                           f"workbench reads version {VERSION}")
    if hsize != HEAD.size:
        raise SegmentRefused(where, segment.MALFORMED, f"header size {hsize}, expected {HEAD.size}")
    if not 0 < total <= MAX_TOTAL or not 1 <= slots <= MAX_SLOTS or created < 0:
        raise SegmentRefused(where, segment.MALFORMED, f"total {total} or slots {slots} out of "
                                                       "range")
    if len(data) != file_size(slots):
        raise SegmentRefused(where, segment.MALFORMED, f"{len(data)} bytes; {slots} slots need "
                                                       f"exactly {file_size(slots)}")
    flat = _slots_struct(slots).unpack_from(data, HEAD.size)  # one call: this runs per page
    pids, starts, helds = flat[0::3], flat[1::3], flat[2::3]
    state = BudgetState(total, slots, created)
    used = [i for i, p in enumerate(pids) if p]
    for i in used:
        pid, start, held = pids[i], starts[i], helds[i]
        if not valid_pid(pid) or start < 0 or not 0 <= held <= MAX_TOTAL:
            raise SegmentRefused(where, segment.MALFORMED, f"slot {i} (pid {pid}, held {held}) "
                                                           "out of range")
        state.holders[i] = Holder(pid, start, held)
    if len(used) < slots and (min(helds) < 0 or sum(helds) != state.held):
        i = next(i for i, (p, h) in enumerate(zip(pids, helds, strict=True)) if h and not p)
        raise SegmentRefused(where, segment.MALFORMED, f"slot {i} holds {helds[i]} bytes "
                                                       "without a holder")
    return state


@lru_cache(maxsize=8)
def _slots_struct(slots: int) -> struct.Struct:
    return struct.Struct(f"<{3 * slots}q")


def refusal(path: Path | str, err: SegmentRefused) -> ConfigError:
    """A budget file this workbench will not touch, as the one line a user sees."""
    return ConfigError(f"GPU budget {plain(path)}", plain(err.detail),
                       "remove it if it is yours, or set WORKBENCH_KV_SHM_DIR to a directory of "
                       "your own")


class SharedBudget:
    """This process's handle on one GPU's budget file: charge, credit, reclaim, read."""

    def __init__(self, path: Path, fd: int, st: os.stat_result):
        self.path, self.fd, self.size = path, fd, st.st_size
        self._ino = (st.st_dev, st.st_ino)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.me = my_identity()
        self.misses = 0
        self.reclaimed = 0  # bytes of dead holders this handle reclaimed (attaching included)
        self._alive: dict[tuple[int, int], tuple[bool, float]] = {}  # holder -> (alive, when)

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def open(cls, ident: str, total: int | None = None, *, shm_dir: Path | str | None = None,
             slots: int = NUM_SLOTS) -> SharedBudget | None:
        """Attach to device ``ident``'s budget, creating it with ``total`` if there is none
        (``total=None``: attach only; None if there is none). A total that differs from the
        file's is adopted when no live process holds bytes, refused otherwise."""
        if total is not None and not 0 < total <= MAX_TOTAL:
            raise ConfigError(f"GPU budget {total}", f"is not in 1..{MAX_TOTAL} bytes",
                              "give a positive size")
        path = budget_path(ident, shm_dir)
        for _ in range(3):
            try:
                opened = open_checked(path, write=True)
            except SegmentRefused as err:
                raise refusal(path, err) from None
            if opened is None:
                if total is None:
                    return None
                _create(path, total, slots)
                continue
            self = cls(path, *opened)
            try:
                self._adopt(total)
            except SegmentRefused as err:
                self.close()
                raise refusal(path, err) from None
            except TimeoutError as err:
                self.close()
                raise ConfigError(f"GPU budget {path}", str(err), "find the process that "
                                  "holds it (fuser) and stop it") from None
            except BaseException:
                self.close()
                raise
            return self
        raise ConfigError(f"GPU budget {path}", "kept changing while this process opened it",
                          "retry")

    def _adopt(self, total: int | None) -> None:
        with self._locked() as state:
            self._reclaim(state)
            if total is None or total == state.total:
                return
            live = [h for h in state.holders.values() if h.held]
            if live:
                raise ConfigError(f"GPU budget {self.path}", f"total is {state.total} bytes, held "
                                  f"by live process {live[0].pid}; this process asks for {total}",
                                  "use the same WORKBENCH_KV_GPU_BUDGET in every process")
            os.pwrite(self.fd, struct.pack("<q", total), 16)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- the read-modify-write ---------------------------------------------------------------
    def _reopen_after_fork(self) -> None:
        """A forked child shares the parent's open file description, hence its flock: reopen."""
        try:
            opened = open_checked(self.path, write=True)
        except SegmentRefused as err:
            raise refusal(self.path, err) from None
        if opened is None:
            raise ConfigError(f"GPU budget {self.path}", "vanished", "restart the process")
        os.close(self.fd)
        self.fd, st = opened
        self.size, self._ino = st.st_size, (st.st_dev, st.st_ino)
        self._pid, self.me = os.getpid(), my_identity()
        self._lock = threading.Lock()

    @contextmanager
    def _locked(self):
        """The parsed budget, under the exclusive lock; raises SegmentRefused if the file is no
        longer a budget, TimeoutError if a peer holds the lock for too long."""
        if os.getpid() != self._pid:
            self._reopen_after_fork()
        with self._lock:
            if not segment.try_flock(self.fd, fcntl.LOCK_EX, LOCK_TIMEOUT_S):
                raise TimeoutError(f"{self.path} stayed locked for {LOCK_TIMEOUT_S} s")
            try:
                yield parse(os.pread(self.fd, self.size + 1, 0), str(self.path))
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _write_slot(self, i: int, h: Holder | None) -> None:
        vals = (0, 0, 0) if h is None else (h.pid, h.start, h.held)
        os.pwrite(self.fd, SLOT.pack(*vals), HEAD.size + i * SLOT.size)

    def _reclaim(self, state: BudgetState) -> int:
        """Empty the slots of holders that are gone; returns the bytes reclaimed."""
        freed = 0
        for i, h in list(state.holders.items()):
            if (h.pid, h.start) != self.me and not pid_alive(h.pid, h.start or None):
                freed += h.held
                del state.holders[i]
                self._write_slot(i, None)
        self.reclaimed += freed
        return freed

    def _my_slot(self, state: BudgetState) -> int | None:
        for i, h in state.holders.items():
            if (h.pid, h.start) == self.me:
                return i
        return next((i for i in range(state.slots) if i not in state.holders), None)

    def charge(self, nbytes: int) -> bool:
        """Take ``nbytes`` from the total: True, or False (a miss; nothing taken) when the rest
        of the total is smaller, no slot is free, or the file is unusable or stays locked."""
        try:
            with self._locked() as state:
                if state.held + nbytes > state.total or self._my_slot(state) is None:
                    self._reclaim(state)  # only a would-be miss pays for the liveness checks
                i = self._my_slot(state)
                if i is None or state.held + nbytes > state.total:
                    self.misses += 1
                    return False
                h = state.holders.get(i) or Holder(*self.me, 0)
                h.held += nbytes
                self._write_slot(i, h)
                return True
        except (SegmentRefused, TimeoutError, OSError):
            self.misses += 1
            return False

    def credit(self, nbytes: int) -> None:
        """Give ``nbytes`` back (after the memory was released). Never raises: a credit that
        cannot be written stays charged until this process exits (then it is reclaimed)."""
        try:
            with self._locked() as state:
                i = self._my_slot(state)
                h = state.holders.get(i) if i is not None else None
                if h is None:
                    return
                h.held = max(0, h.held - nbytes)
                self._write_slot(i, h if h.held else None)
        except (SegmentRefused, TimeoutError, OSError):
            return

    def reclaim(self) -> int:
        """Reclaim every dead holder's bytes now (``kvctl budget --gc``)."""
        with self._locked() as state:
            return self._reclaim(state)

    def state(self) -> BudgetState:
        """A consistent reading (under the lock), liveness filled in."""
        with self._locked() as state:
            pass
        for h in state.holders.values():
            h.alive = pid_alive(h.pid, h.start or None)
        return state

    def totals(self) -> tuple[int, int]:
        """(total, held by live holders) from one lock-free read: a hint for a headroom check
        (the charge decides, and reclaims), cheap enough for every new page: each other
        holder's liveness is looked up at most once a second. A dead holder's bytes are not
        counted, so a pool whose headroom they hide still tries the charge that reclaims them.
        (0, 0) if the file is unusable."""
        try:
            state = parse(os.pread(self.fd, self.size + 1, 0), str(self.path))
        except (SegmentRefused, OSError):
            return 0, 0
        return state.total, sum(h.held for h in state.holders.values()
                                if self._live((h.pid, h.start)))

    def _live(self, who: tuple[int, int], every_s: float = 1.0) -> bool:
        if who == self.me:
            return True
        now = time.monotonic()
        alive, when = self._alive.get(who, (True, -every_s))
        if now - when >= every_s:
            alive = pid_alive(who[0], who[1] or None)
            if len(self._alive) > 256:  # holders come and go; keep the cache small
                self._alive.clear()
            self._alive[who] = (alive, now)
        return alive

    def held_by_me(self) -> int:
        return sum(h.held for h in self.state().holders.values()
                   if (h.pid, h.start) == self.me)


def _create(path: Path, total: int, slots: int) -> None:
    """Write a complete budget under a temporary name and link it into place (a peer that got
    there first wins; the caller then opens that one). Dead creators' leftovers go first."""
    gc_partials(path.parent)
    pid, start = my_identity()
    tmp = path.with_name(f"{PARTIAL_PREFIX}{pid}_{start}_{secrets.token_hex(4)}_"
                         f"{path.name[len(PREFIX):]}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        data = HEAD.pack(MAGIC, VERSION, HEAD.size, total, slots, time.time_ns())
        os.pwrite(fd, data + bytes(slots * SLOT.size), 0)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.close(fd)
        tmp.unlink(missing_ok=True)


def gc_partials(shm_dir: Path | str | None = None) -> list[str]:
    """Remove the ``wbkvbudnew_`` files of creators that are gone (a crash between creating and
    linking): only this user's regular files, empty or carrying the budget magic. Returns the
    entries removed; anything else is left alone."""
    where = Path(shm_dir or segment.SHM_DIR)
    try:
        entries = sorted(e for e in os.listdir(where) if e.startswith(PARTIAL_PREFIX))
    except OSError:
        return []
    removed = []
    for entry in entries:
        owner = partial_owner(entry, PARTIAL_PREFIX)
        if owner is None or pid_alive(owner[0], owner[1] or None):
            continue
        try:
            opened = open_checked(where / entry)
        except SegmentRefused:
            continue
        if opened is None:
            continue
        fd, st = opened
        try:
            head = os.pread(fd, len(MAGIC), 0)
        except OSError:
            continue
        finally:
            os.close(fd)
        if head in (b"", MAGIC) and unlink_if_same(where / entry, st):
            removed.append(entry)
    return removed


def read_budget(path: Path) -> BudgetState | None:
    """A reader's look (kvctl, kvtop): None if nothing is there, SegmentRefused if what is there
    is not a budget. Reads without the lock (a reading may be one charge old) and writes nothing."""
    opened = open_checked(path)
    if opened is None:
        return None
    fd, st = opened
    try:
        state = parse(os.pread(fd, st.st_size + 1, 0), str(path))
    finally:
        os.close(fd)
    for h in state.holders.values():
        h.alive = pid_alive(h.pid, h.start or None)
    return state


def scan_budgets(shm_dir: Path | str | None = None
                 ) -> tuple[dict[str, BudgetState], list[SegmentRefused]]:
    """Every budget in the shm folder by device name, and the entries skipped (with why)."""
    where = Path(shm_dir or segment.SHM_DIR)
    found: dict[str, BudgetState] = {}
    skipped: list[SegmentRefused] = []
    try:
        entries = sorted(e for e in os.listdir(where) if e.startswith(PREFIX))
    except OSError:
        return found, skipped
    for entry in entries:
        try:
            state = read_budget(where / entry)
        except SegmentRefused as err:
            skipped.append(err)
            continue
        if state is not None:
            found[entry[len(PREFIX):]] = state
    return found, skipped


def delete_budget(ident: str, shm_dir: Path | str | None = None) -> bool:
    """Remove a budget no live process holds bytes of; False if there was none."""
    path = budget_path(ident, shm_dir)
    try:
        state = read_budget(path)
    except SegmentRefused as err:
        raise refusal(path, err) from None
    if state is None:
        return False
    live = [h for h in state.holders.values() if h.alive and h.held]
    if live:
        raise ConfigError(f"GPU budget {path}", f"live process {live[0].pid} holds "
                          f"{live[0].held} bytes of it", "stop its engines first")
    return unlink_if_same(path, os.lstat(path))
