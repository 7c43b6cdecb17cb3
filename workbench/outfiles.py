"""Every file the workbench writes for a user (``--out``, ``--html``, a lab's record and report,
its repeat files), and its stdout.

A ``python -m`` tool's main runs through :func:`run_main`, which refuses as the console script
does. A log written as the run goes (:func:`open_stream`) cannot be atomic: it is checked before
the run like the rest and opened without following a link.

A destination is checked before the run (:class:`Outputs`): its folder, or the nearest one that
exists, is a folder this process can create a file in (a probe file is made and removed, so a
read-only mount or a missing permission is found as root and non-root alike) on a file system
with space left; the target is not a folder, a FIFO or a device; no two outputs of one run share a
name (``--out X.md`` would put the report over the record). Writing (:func:`write_all`) puts every
file's bytes in a temporary file in the target's folder, synced, then renames each over its
target: a planted symlink is replaced, never written through; a failure (a full disk) removes
every temporary file and is one :class:`ConfigError` line, with nothing partial left.

stdout (:func:`guard_stdout`): a write that fails (closed, a full device, a closed pipe) raises
:class:`StdoutLost`, which the console script turns into a quiet non-zero exit.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

from workbench.errors import ConfigError, WorkbenchError
from workbench.strictjson import dumps
from workbench.terminal import plain

__all__ = ["Outputs", "StdoutLost", "check", "drop_stdout", "guard_stdout", "open_stream",
           "run_main", "write_all", "write_repeat", "write_text"]

NAME_MAX = 255  # bytes in one path component on Linux's file systems
FIX = "give a path in a folder you can write, on a file system with space left"


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _kind(mode: int) -> str | None:
    """What a non-regular entry is, in words; None for a regular file or a symlink."""
    for test, word in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return word
    return None


def _shown(path: Path) -> str:
    return plain(path)  # a name with a newline or an escape still prints one line


def _refuse(flag: str, path: Path, why: str, fix: str = FIX) -> ConfigError:
    return ConfigError(f"{flag} {_shown(path)}", why, fix)


def _existing_folder(path: Path, flag: str) -> Path:
    """The nearest folder above ``path`` that exists; refused if an entry on the way is not one."""
    here = path.parent
    while True:
        try:
            st = os.stat(here)  # a folder reached through a symlink is the user's choice
        except (FileNotFoundError, NotADirectoryError):
            if here == here.parent:
                raise _refuse(flag, path, "no folder on the way to it exists") from None
            here = here.parent
            continue
        except OSError as err:
            raise _refuse(flag, path, f"its folder {_shown(here)} cannot be examined "
                                      f"({err.strerror})") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(flag, path, f"{_shown(here)} is {_kind(st.st_mode) or 'a file'}, not a "
                                      "folder", "give a path whose parent is a folder")
        return here


def _probe(folder: Path, path: Path, flag: str) -> None:
    """Create and remove a file in ``folder``: the only test a read-only mount cannot fool."""
    probe = folder / f".wbprobe-{secrets.token_hex(6)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError as err:
        raise _refuse(flag, path, f"its folder {_shown(folder)} takes no new file "
                                  f"({errno.errorcode.get(err.errno or 0, '?')}: "
                                  f"{err.strerror})") from None
    os.close(fd)
    os.unlink(probe)
    try:
        vfs = os.statvfs(folder)
    except OSError:
        return
    if vfs.f_bavail == 0 and vfs.f_blocks:
        raise _refuse(flag, path, f"the file system of {_shown(folder)} has no space left")


def check(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` as a destination this process can write, or one ConfigError line saying why not
    (before anything runs)."""
    p = Path(path)
    if not str(path) or len(os.fsencode(p.name)) > NAME_MAX or p.name in ("", ".", ".."):
        raise _refuse(flag, p, "is not a file name", "give a file name, e.g. record.json")
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):  # the folder's absence is told below
        st = None
    except OSError as err:
        raise _refuse(flag, p, f"cannot be examined ({err.strerror})") from None
    if st is not None:
        kind = _kind(st.st_mode)
        if kind is not None:
            raise _refuse(flag, p, f"is {kind}, not a file", "give a file name")
        if stat.S_ISREG(st.st_mode) and not os.access(p, os.W_OK, follow_symlinks=False):
            raise _refuse(flag, p, "is a read-only file", "make it writable or give another name")
    _probe(_existing_folder(p, flag), p, flag)
    return p


class Outputs:
    """The files one run will write, each checked before it runs and no two of the same name."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, str | None]] = {}

    def add(self, path: str | os.PathLike, flag: str = "--out", same: str | None = None) -> Path:
        """``path`` checked; refused if another output already goes there, unless both are the
        same text (``same`` names it: the report, asked for by --out and --html)."""
        p = check(path, flag)
        key = os.path.normpath(os.path.abspath(p))
        if key in self._seen:
            other, text = self._seen[key]
            if same is not None and text == same:
                return p
            raise _refuse(flag, p, f"is also where {other} goes",
                          "give the outputs different names (a record ends in .json)")
        self._seen[key] = (f"{flag} {_shown(p)}", same)
        return p

    def folder(self, path: str | os.PathLike, names: Iterable[str], flag: str,
               same: str | None = None) -> Path:
        """A folder of outputs (``--html``): the folder itself and each file in it."""
        d = Path(path)
        try:
            st = os.stat(d)
        except (FileNotFoundError, NotADirectoryError):  # (a file on the way: told by add)
            st = None
        except OSError as err:
            raise _refuse(flag, d, f"cannot be examined ({err.strerror})") from None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise _refuse(flag, d, f"is {_kind(st.st_mode) or 'a file'}, not a folder",
                          "give a folder (it is created if missing)")
        for name in names:
            self.add(d / name, flag, same)
        return d


def _write_fully(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _temp(path: Path) -> tuple[Path, int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name[:100]}.{secrets.token_hex(4)}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o666 & ~_umask())
    return tmp, fd


def write_all(files: Iterable[tuple[str | os.PathLike, str | bytes]],
              flag: str = "--out") -> list[Path]:
    """Write every ``(path, text or bytes)`` or none: all to temporary files first (synced),
    then each renamed over its target. A failure is one ConfigError line; no temporary file is
    left and no target is touched."""
    staged: list[tuple[Path, Path]] = []
    where = Path(".")
    unique = {os.path.abspath(p): (p, d) for p, d in files}  # the same text asked for twice
    try:
        for path, data in unique.values():
            where = Path(path)
            blob = data.encode() if isinstance(data, str) else bytes(data)
            tmp, fd = _temp(where)
            staged.append((tmp, where))
            try:
                _write_fully(fd, blob)
                os.fsync(fd)
            finally:
                os.close(fd)
        for tmp, target in staged:
            where = target
            os.replace(tmp, target)  # the entry is replaced: a symlink there is never followed
    except OSError as err:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        code = errno.errorcode.get(err.errno or 0, "?")
        raise _refuse(flag, where, f"could not be written ({code}: {err.strerror}); nothing "
                                   "was left behind") from None
    return [target for _, target in staged]


def write_text(path: str | os.PathLike, text: str, flag: str = "--out") -> Path:
    return write_all([(path, text)], flag)[0]


def open_stream(path: str | os.PathLike, flag: str = "--out", binary: bool = False,
                append: bool = False):
    """``path`` opened to write a log as the run goes (truncated, or appended to): a link or a
    non-file there is refused in one line, never written through."""
    p = Path(path)
    try:  # (non-blocking: a FIFO without a reader is refused, not waited on)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     0o666 & ~_umask())
    except OSError as err:
        why = ("is a symbolic link" if err.errno == errno.ELOOP else
               f"could not be opened ({errno.errorcode.get(err.errno or 0, '?')}: "
               f"{err.strerror})")
        raise _refuse(flag, p, why) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refuse(flag, p, "is not a file", "give a file name")
    os.set_blocking(fd, True)
    if append:
        os.lseek(fd, 0, os.SEEK_END)
    else:
        os.ftruncate(fd, 0)  # truncated only once it is known to be a file
    return os.fdopen(fd, ("a" if append else "w") + ("b" if binary else ""),
                     **({} if binary else {"buffering": 1, "encoding": "utf-8"}))


def write_repeat(out_dir: str | os.PathLike | None, rep: dict) -> Path | None:
    """A lab's ``repeat_<n>.json`` after every point (a run cut short keeps what it finished)."""
    if not out_dir:
        return None
    return write_text(Path(out_dir) / f"repeat_{rep['repeat']}.json", dumps(rep), "out_dir")


# -- stdout --------------------------------------------------------------------------------------


class StdoutLost(OSError):
    """stdout cannot take what a command prints (closed, a full device, a closed pipe)."""


class _GuardedOut(io.RawIOBase):
    """fd 1, or nothing when it was closed: a failed write raises :class:`StdoutLost`."""

    def __init__(self, fd: int | None):
        super().__init__()
        self.fd = fd
        self.dropped = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        if self.fd is None:
            raise OSError(errno.EBADF, "stdout is closed")
        return self.fd

    def isatty(self) -> bool:
        return self.fd is not None and os.isatty(self.fd)

    def write(self, b) -> int:  # noqa: ANN001 - io's signature
        if self.dropped:
            return len(b)
        if self.fd is None:
            raise StdoutLost(errno.EBADF, "stdout is closed")
        try:
            return os.write(self.fd, b)
        except OSError as err:
            raise StdoutLost(err.errno, err.strerror) from None


def _occupy(fd: int) -> bool:
    """Put /dev/null on ``fd`` if it is closed (so no file opened later lands there); True if
    it was closed."""
    try:
        os.fstat(fd)
        return False
    except OSError:
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        return True


def guard_stdout() -> None:
    """Make every failed write to stdout a :class:`StdoutLost` (the console script's start),
    buffered as the interpreter buffered it (``-u``, a terminal: by line)."""
    closed = [_occupy(fd) for fd in (0, 1, 2)][1]
    old = sys.stdout
    raw = _GuardedOut(None if closed else 1)
    unbuffered = old is not None and not isinstance(getattr(old, "buffer", None),
                                                    io.BufferedWriter)
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(raw), encoding=getattr(old, "encoding", None) or "utf-8",
        errors=getattr(old, "errors", None) or "strict", write_through=unbuffered,
        line_buffering=unbuffered or bool(getattr(old, "line_buffering", False)))


def run_main(main, argv: list[str] | None = None) -> int:
    """A ``python -m`` tool's ``main(argv)`` run as the console script runs a command: a
    WorkbenchError is one ``error:`` line (exit 2), stdout that takes nothing more ends it
    quietly (exit 1)."""
    guard_stdout()
    try:
        try:
            return main(argv) or 0
        finally:
            sys.stdout.flush()
    except StdoutLost:
        drop_stdout()
        return 1
    except WorkbenchError as err:
        print(f"error: {plain(' '.join(str(err).split()))}", file=sys.stderr)
        return 2


def drop_stdout() -> None:
    """After a :class:`StdoutLost`: what is still buffered goes nowhere, so the interpreter's
    own flush at exit raises nothing."""
    raw = getattr(getattr(sys.stdout, "buffer", None), "raw", None)
    if isinstance(raw, _GuardedOut):
        raw.dropped = True
