"""Engine processes that never outlive their run: each starts in a session of its own (so its
whole process group can be signalled), dies with its parent (``PR_SET_PDEATHSIG``), and is
stopped -- with its control segment and socket folder removed -- by :meth:`Reaper.close`, which
runs on ``close()``, at interpreter exit and on SIGTERM/SIGINT."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from /proc, so reparented ones are missed: the
    process group catches those)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def group_members(pgid: int) -> list[int]:
    """Live processes (zombies excluded) whose process group is ``pgid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            if int(rest[2]) == pgid and rest[0] != "Z":
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return out


@dataclass(slots=True)
class Reaper:
    """What one engine started: processes, control segment names, folders. ``close`` is
    idempotent and safe from a signal handler's thread."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    grace_s: float = 15.0
    closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        _LIVE.append(self)

    def spawn(self, cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_die_with_parent)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            for proc in self.procs:
                _stop(proc, self.grace_s)
            self._remove_segments()
            for d in self.folders:
                shutil.rmtree(d, ignore_errors=True)
            with contextlib.suppress(ValueError):
                _LIVE.remove(self)

    def _remove_segments(self) -> None:
        from workbench.core import control

        for name in self.segments:
            with contextlib.suppress(Exception):
                info = control.read_segment(name)
                # its owner is ours and stopped; a zombie (reaped by nobody once its parent
                # died) still counts as alive to the segment's own check
                if info is not None and not _alive(info.owner_pid):
                    control.delete_segment(name, force=True)


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the process group (and every descendant found), wait, then SIGKILL."""
    pgid = proc.pid
    victims = set(descendants(proc.pid)) | {proc.pid}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < end:
            with contextlib.suppress(ChildProcessError):
                proc.poll()
            if proc.returncode is not None and not group_members(pgid) and \
                    not any(_alive(p) for p in victims):
                return
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


_LIVE: list[Reaper] = []
_INSTALLED = False


def close_all() -> None:
    for r in list(_LIVE):
        r.close()


def install_handlers() -> None:
    """Close every live reaper at exit and on SIGTERM/SIGINT (then the signal's usual effect).
    Only from the main thread; elsewhere the exit hook alone is installed."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    atexit.register(close_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum, frame, previous=previous):
            close_all()
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)
