"""Is a process still there? One liveness test for every leftover (segments, socket dirs), on
psutil.

A pid alone is not an identity: the kernel reuses pids. An owner records its pid *and* its start
time (clock ticks since boot, field 22 of ``/proc/<pid>/stat``; psutil's ``create_time`` is the
same instant in seconds since the epoch, so the ticks are recovered exactly); it is alive only
while a process with that pid runs (a zombie does not) and started at that time. Garbage (a pid
of 2**63, a negative one, a string) is simply not alive: this module never raises.
"""

from __future__ import annotations

import os

import psutil

PID_MAX_LIMIT = 1 << 22  # Linux's ceiling for /proc/sys/kernel/pid_max on 64-bit systems
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_NOT_RUNNING = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def valid_pid(pid: object) -> bool:
    return type(pid) is int and 0 < pid <= PID_MAX_LIMIT


def proc_start_time(pid: object) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone or unknown."""
    if not valid_pid(pid):
        return None
    try:
        created = psutil.Process(pid).create_time()  # type: ignore[arg-type]
    except (psutil.Error, OSError, ValueError):  # gone, a zombie's stat unreadable, denied
        return None
    return _ticks(created)


def _ticks(created: float) -> int:
    return round((created - psutil.boot_time()) * _TICKS)


def pid_alive(pid: object, start: object = None) -> bool:
    """True if ``pid`` is running and (when ``start`` is given) started at ``start``.

    Running, not merely in the process table: a zombie (exited, not yet reaped by its parent)
    holds no memory and will never poll again, so its budget bytes and segments are reclaimable.
    A process we cannot inspect (the pid exists but its stat is unreadable) counts as alive:
    callers delete what is dead, so "unknown" must never read as dead.
    """
    if not valid_pid(pid):  # also: pid 0 would ask about our own process group
        return False
    try:
        proc = psutil.Process(pid)  # type: ignore[arg-type]
        with proc.oneshot():  # one read of /proc/<pid>/stat for both fields
            if proc.status() in _NOT_RUNNING:
                return False
            created = proc.create_time()
    except psutil.NoSuchProcess:  # ZombieProcess included: psutil's word for the same thing
        return False
    except (psutil.Error, OSError, ValueError):
        try:
            return psutil.pid_exists(pid)  # type: ignore[arg-type]
        except (psutil.Error, OSError, ValueError):
            return True
    return start is None or _ticks(created) == start


def my_identity() -> tuple[int, int]:
    """This process's (pid, start time) as an owner records them; start is 0 when unknown."""
    pid = os.getpid()
    return pid, proc_start_time(pid) or 0


def memory_total() -> int | None:
    """This host's physical memory in bytes."""
    try:
        return int(psutil.virtual_memory().total)
    except (psutil.Error, OSError):
        return None
