"""The control segment's file format, and the checks every reader makes before it trusts one.

``/dev/shm`` is shared by every user and process on the machine, so a file named like a segment
proves nothing. A reader opens it with ``O_NOFOLLOW | O_NONBLOCK`` (a symlink fails, a FIFO does
not block), then ``fstat``s the descriptor it holds: a regular file, owned by this user, no larger
than the largest segment. It reads the bytes with ``pread`` (never ``mmap``: a file truncated under
a mapping raises SIGBUS) and :func:`parse` accepts them only with the magic, this version, the
exact header size, in-range fields and a size of exactly header + one byte per page. Anything
else is a :class:`SegmentRefused` naming the file and the reason in one line.

Layout (little endian, version 2): ``magic[8] version:u32 header_size:u32``, then the int64
``FIELDS``, then one state byte per page id. Version 2 added the owner's start time (pid reuse)
and per-request ids and answers.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import time
from pathlib import Path

from workbench.errors import ConfigError, ControlError
from workbench.names import check_name
from workbench.procs import pid_alive, valid_pid
from workbench.settings import settings
from workbench.terminal import plain

SHM_DIR = Path(settings(only="shm_dir").shm_dir)
PREFIX = "wbkv_"
PARTIAL_PREFIX = "wbkvnew_"  # wbkvnew_<pid>_<start>_<name>: a segment still being written
MAGIC = b"WBKVSEG\x00"
VERSION = 2
FIELDS = ("owner_pid", "owner_start", "heartbeat_ns", "capacity", "page_id_bytes", "num_pages",
          "limit", "revision", "req_limit", "req_revision", "req_id", "ack_revision", "ack_id",
          "ack_outcome", "outcome", "used", "reserved", "mapped", "used_blocks",
          "available_blocks", "block_size")
HEAD = struct.Struct("<8sII")
BODY = struct.Struct(f"<{len(FIELDS)}q")
OFF = {name: HEAD.size + 8 * i for i, name in enumerate(FIELDS)}
HEADER_SIZE = HEAD.size + BODY.size
MAX_PAGES = 1 << 24  # 16 Mi page ids: far beyond any device, small enough to read at once
MAX_FIELD = 1 << 62  # any counter: a next revision (+1) and any sum of two still fit an i64
BYTES_OF_PAGES = ("used", "reserved", "mapped")  # parts of the capacity
OUTCOMES = ("applied", "deferred", "stale", "conflict", "rejected")

# why an entry was skipped: the categories `kvctl list` counts
NOT_REGULAR, SYMLINK, FOREIGN, MALFORMED, OTHER_VERSION, BAD_NAME, UNREADABLE = (
    "not a regular file", "symlink", "another user's", "malformed", "other version",
    "bad name", "unreadable")


class SegmentRefused(ControlError):
    """An entry under a segment's name that is not a trustworthy segment: skipped, never used."""

    def __init__(self, path: Path | str, kind: str, detail: str):
        self.path, self.kind, self.detail = str(path), kind, detail
        super().__init__(f"skipped {plain(path)}: {plain(detail)}")


def segment_path(name: str) -> Path:
    return SHM_DIR / (PREFIX + check_name(name))


def _file_kind(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return word
    return "not a regular file"


def check_stat(path: Path | str, st: os.stat_result) -> None:
    """A regular file, owned by this user, no larger than the largest segment."""
    if stat.S_ISLNK(st.st_mode):
        raise SegmentRefused(path, SYMLINK, "a symbolic link, not a segment")
    if not stat.S_ISREG(st.st_mode):
        raise SegmentRefused(path, NOT_REGULAR, f"{_file_kind(st.st_mode)}, not a segment")
    if st.st_uid != os.getuid():
        raise SegmentRefused(path, FOREIGN, f"owned by uid {st.st_uid}, not by this user "
                                            f"(uid {os.getuid()})")
    if st.st_size > HEADER_SIZE + MAX_PAGES:
        raise SegmentRefused(path, MALFORMED, f"{st.st_size} bytes, larger than any segment")


def open_checked(path: Path, write: bool = False) -> tuple[int, os.stat_result] | None:
    """Open ``path`` only if it is a regular file of this user, without following a symlink or
    blocking on a FIFO. Returns (fd, stat), None if nothing is there, or raises
    :class:`SegmentRefused`. The entry is checked before the open (a device is never opened) and
    the descriptor after it (the entry may have been swapped in between)."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise SegmentRefused(path, UNREADABLE, f"cannot be examined ({err.strerror})") from None
    check_stat(path, before)
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | \
        os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as err:
        code = errno.errorcode.get(err.errno or 0, "?")
        raise SegmentRefused(path, UNREADABLE, f"cannot be opened ({code}: {err.strerror})") \
            from None
    try:
        st = os.fstat(fd)
        check_stat(path, st)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise SegmentRefused(path, UNREADABLE, "was replaced while being opened")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def parse(data: bytes, where: str = "segment") -> tuple[dict[str, int], bytes]:
    """The header fields and page-state bytes of a segment, or :class:`SegmentRefused`.

    Total on every input: this is the only place bytes from outside become numbers."""
    if len(data) >= HEAD.size:  # magic and version first: an old segment says so
        magic, version, hsize = HEAD.unpack_from(data, 0)
        if magic != MAGIC:
            raise SegmentRefused(where, MALFORMED, "no segment magic: not a workbench segment")
        if version != VERSION:
            raise SegmentRefused(where, OTHER_VERSION, f"segment version {version}; this "
                                                       f"workbench reads version {VERSION}")
    if len(data) < HEADER_SIZE:
        raise SegmentRefused(where, MALFORMED, f"{len(data)} bytes, shorter than the "
                                               f"{HEADER_SIZE}-byte header (empty or half-written)")
    if hsize != HEADER_SIZE:
        raise SegmentRefused(where, MALFORMED, f"header size {hsize}, expected {HEADER_SIZE}")
    v = dict(zip(FIELDS, BODY.unpack_from(data, HEAD.size), strict=True))
    n = v["num_pages"]
    if not 1 <= n <= MAX_PAGES:
        raise SegmentRefused(where, MALFORMED, f"num_pages {n} out of range 1..{MAX_PAGES}")
    if len(data) != HEADER_SIZE + n:
        raise SegmentRefused(where, MALFORMED, f"{len(data)} bytes; {n} pages need exactly "
                                               f"{HEADER_SIZE + n}")
    if not valid_pid(v["owner_pid"]):
        raise SegmentRefused(where, MALFORMED, f"owner pid {v['owner_pid']} is not a valid pid")
    if v["page_id_bytes"] <= 0 or v["capacity"] != n * v["page_id_bytes"]:
        raise SegmentRefused(where, MALFORMED, f"capacity {v['capacity']} is not {n} pages of "
                                               f"{v['page_id_bytes']} bytes")
    bad = [f for f in FIELDS if v[f] < 0]
    if bad:
        raise SegmentRefused(where, MALFORMED, f"negative {bad[0]} ({v[bad[0]]})")
    bad = [f for f in FIELDS if v[f] > MAX_FIELD]
    if bad:
        raise SegmentRefused(where, MALFORMED, f"{bad[0]} {v[bad[0]]} is past any counter "
                                               f"(at most 2**62)")
    bad = [f for f in BYTES_OF_PAGES if v[f] > v["capacity"]]
    if bad:
        raise SegmentRefused(where, MALFORMED, f"{bad[0]} {v[bad[0]]} is more than the capacity "
                                               f"({v['capacity']})")
    for f in ("ack_outcome", "outcome"):
        if v[f] >= len(OUTCOMES):
            raise SegmentRefused(where, MALFORMED, f"{f} code {v[f]} is unknown")
    return v, data[HEADER_SIZE:]


def read_fd(fd: int, st: os.stat_result, where: str) -> tuple[dict[str, int], bytes]:
    return parse(os.pread(fd, st.st_size + 1, 0), where)  # +1: a file that grew is malformed


def put_field(fd: int, field: str, value: int) -> None:
    os.pwrite(fd, struct.pack("<q", value), OFF[field])


def entry_name(entry: str) -> str:
    """The IPC name of a ``wbkv_`` directory entry, or :class:`SegmentRefused`."""
    try:
        return check_name(entry[len(PREFIX):], "segment name")
    except ConfigError as err:  # an escaped path: a name with a newline still prints one line
        raise SegmentRefused(f"{SHM_DIR}/{ascii(entry)[1:-1]}", BAD_NAME,
                             f"the name {err.why.split(';')[0]}") from None


def partial_owner(entry: str, prefix: str = PARTIAL_PREFIX) -> tuple[int, int, str] | None:
    """(pid, start, name) of a ``<prefix><pid>_<start>_<token>_<name>`` entry (a segment's or a
    budget's file still being written), or None."""
    if not entry.startswith(prefix):
        return None
    parts = entry[len(prefix):].split("_", 3)
    if len(parts) != 4 or not all(p.isdigit() and p.isascii() for p in parts[:2]):
        return None
    pid, start = int(parts[0]), int(parts[1])
    return (pid, start, parts[3]) if valid_pid(pid) else None


def try_flock(fd: int, op: int, timeout_s: float = 0.0) -> bool:
    """``flock`` without ever blocking for longer than ``timeout_s`` (a peer may hold it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)


def owner_alive(v: dict[str, int]) -> bool:
    return pid_alive(v["owner_pid"], v["owner_start"] or None)


def read_checked(path: Path) -> tuple[dict[str, int], bytes, os.stat_result] | None:
    opened = open_checked(path)
    if opened is None:
        return None
    fd, st = opened
    try:
        v, codes = read_fd(fd, st, str(path))
    finally:
        os.close(fd)
    return v, codes, st


def foreign_header(path: Path, empty_ok: bool = False) -> tuple[str | None, os.stat_result | None]:
    """(None, stat) when ``path`` is this user's regular file that starts with the segment magic
    and a plausible header (so the control plane may remove exactly that file); else (why it is
    someone else's, None). An empty file passes with ``empty_ok`` (a creator that died before
    its first write)."""
    try:
        opened = open_checked(path)
    except SegmentRefused as err:
        return err.detail, None
    if opened is None:
        return "it is gone", None
    fd, st = opened
    try:
        head = os.pread(fd, HEAD.size, 0)
    except OSError as err:
        return f"it cannot be read ({err.strerror})", None
    finally:
        os.close(fd)
    if not head and empty_ok:
        return None, st
    if len(head) < HEAD.size or head[:len(MAGIC)] != MAGIC:
        return "it does not carry the workbench's segment magic (another program's file?)", None
    _, version, hsize = HEAD.unpack(head)
    if not 1 <= version <= 255 or not HEAD.size <= hsize <= 4096:
        return f"its header (version {version}, size {hsize}) is not a segment header", None
    return None, st


def unlink_if_same(path: Path, st: os.stat_result) -> bool:
    """Unlink ``path`` only if it still names the file ``st`` describes (a successor may have
    taken the name in between)."""
    try:
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        path.unlink()
        return True
    except OSError:
        return False


def create_file(tmp: Path, name: str) -> int:
    """The new segment file ``tmp`` (pool ``name``'s), or one ConfigError line saying why its folder
    will not take it."""
    try:
        return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o600)
    except OSError as err:
        code = errno.errorcode.get(err.errno or 0, "?")
        raise ConfigError(f"IPC name {name!r}", f"the shm folder {tmp.parent} takes no segment "
                          f"({code}: {err.strerror})", "set WORKBENCH_KV_SHM_DIR to an existing "
                          "directory you can write, or unset it for /dev/shm") from None


def reserve_space(fd: int, size: int, name: str, folder: Path) -> None:
    """Write the magic, then give the file its blocks now: a mapping of a sparse file on a full
    tmpfs would raise SIGBUS at the first write, where no code can answer it."""
    try:
        os.pwrite(fd, HEAD.pack(MAGIC, VERSION, HEADER_SIZE), 0)  # ours from its first byte
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        code = errno.errorcode.get(err.errno or 0, "?")
        raise ConfigError(f"IPC name {name!r}", f"the shm folder {folder} has no room for a "
                          f"{size}-byte segment ({code}: {err.strerror})",
                          "free space there (or set WORKBENCH_KV_SHM_DIR elsewhere)") from None

