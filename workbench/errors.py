"""Typed errors. An allocation miss is never an error (it is ``None``); these are for the rest."""

from __future__ import annotations


class WorkbenchError(Exception):
    """Base of every error the workbench raises on purpose."""


class ConfigError(WorkbenchError, ValueError):
    """Bad configuration or input. The message says what, why, and what to change."""

    def __init__(self, what: str, why: str, fix: str):
        self.what, self.why, self.fix = what, why, fix
        super().__init__(f"{what}: {why}. Fix: {fix}")


class DeviceError(WorkbenchError, RuntimeError):
    """A device (driver) call failed. ``op`` names the call, ``code`` the driver's status."""

    def __init__(self, op: str, message: str, code: int | str | None = None):
        self.op, self.code = op, code
        suffix = f" (code {code})" if code is not None else ""
        super().__init__(f"{op} failed: {message}{suffix}")


class InjectedFault(DeviceError):
    """A device failure injected on purpose by a fault schedule."""


class StateConsistencyError(WorkbenchError, RuntimeError):
    """The pool's state is inconsistent or unknown; the pool is failed and refuses further work."""


class MapQuarantinedError(WorkbenchError, RuntimeError):
    """A map failed and its rollback failed too; the page is quarantined (never issued again)."""


class PoolFailedError(StateConsistencyError):
    """An operation on a pool that has already failed."""


class ControlError(WorkbenchError):
    """A control-plane request (kvctl) that cannot be carried out; nothing was written."""


class NotFoundError(WorkbenchError, KeyError):
    """A name looked up that does not exist. The message says what, why, and what to change."""

    def __init__(self, what: str, why: str, fix: str):
        self.what, self.why, self.fix = what, why, fix
        super().__init__(f"{what}: {why}. Fix: {fix}")

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0])


class PatchError(WorkbenchError, RuntimeError):
    """A monkey-patch that cannot be applied (already applied, or its target changed)."""


class ProtocolError(WorkbenchError, ValueError):
    """A TP/PP protocol message that is not well formed (unknown kind, missing, extra or
    mistyped field). ``error_type`` is the typed error a worker answers it with."""

    error_type = "bad_request"

    def __init__(self, what: str, why: str, fix: str):
        self.what, self.why, self.fix = what, why, fix
        super().__init__(f"{what}: {why}. Fix: {fix}")


class FrameError(ProtocolError):
    """A wire frame that cannot be decoded: too long, nested too deep, not a JSON object."""

    error_type = "bad_frame"


class PeerClosedError(WorkbenchError, ConnectionError):
    """The peer of a socket closed the connection (before or in the middle of a frame)."""


class PoolClosedError(WorkbenchError, RuntimeError):
    """A call on a pool after its ``close()``: its pages and its reservation are gone."""

    def __init__(self, pool: str):
        self.pool = pool
        super().__init__(f"pool {pool} is closed: close() gave its pages and reservation back. "
                         f"Fix: build a new pool, or drop the call")
