"""Is a process still there? One liveness test for every leftover (segments, socket dirs).

A pid alone is not an identity: the kernel reuses pids. An owner records its pid *and* its start
time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot); it is alive only while a process
with that pid runs and started at that time. Garbage (a pid of 2**63, a negative one, a string)
is simply not alive: this module never raises.
"""

from __future__ import annotations

import os

PID_MAX_LIMIT = 1 << 22  # Linux's ceiling for /proc/sys/kernel/pid_max on 64-bit systems


def valid_pid(pid: object) -> bool:
    return type(pid) is int and 0 < pid <= PID_MAX_LIMIT


def proc_start_time(pid: object) -> int | None:
    """The process's start time in clock ticks (from /proc), or None if it is gone or unknown."""
    if not valid_pid(pid):
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096).decode(errors="replace")
        # the command name (field 2) may hold spaces and parentheses: split after the last ')'
        return int(data.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: object, start: object = None) -> bool:
    """True if ``pid`` runs and (when ``start`` is given) started at ``start``.

    A process we cannot inspect (no /proc entry but ``kill(pid, 0)`` finds it) counts as alive:
    callers delete what is dead, so "unknown" must never read as dead.
    """
    if not valid_pid(pid):  # also: kill(0, 0) would ask about our own process group
        return False
    now = proc_start_time(pid)
    if now is not None:
        return start is None or now == start
    try:
        os.kill(pid, 0)  # type: ignore[arg-type]
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def my_identity() -> tuple[int, int]:
    """This process's (pid, start time) as an owner records them; start is 0 without /proc."""
    pid = os.getpid()
    return pid, proc_start_time(pid) or 0
