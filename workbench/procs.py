"""Is a process still there? Finds the leftovers (segments, socket dirs) of dead owners."""

from __future__ import annotations

import os


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (from /proc), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
        return int(data.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int, start: int | None = None) -> bool:
    """True if ``pid`` runs and (when given) started at ``start`` (guards against pid reuse)."""
    if pid <= 0:  # kill(0, 0) would ask about our own process group
        return False
    now = proc_start_time(pid)
    if now is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return start is None
    return start is None or now == start
