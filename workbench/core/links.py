"""What the coordinator needs from the path to its workers: the :class:`Transport` protocol (the
SimPy cluster and the socket transport implement it), :class:`TransportError`, and
:class:`FanOutDevice`, the device view a fan-out pool's page allocator sees."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from workbench.core.device import MemInfo
from workbench.core.messages import Reply, Request, WorkerId
from workbench.errors import WorkbenchError

# What a transport hands back per target: a typed reply, whatever undecodable object came back
# (reported as a malformed reply), or None (lost, timed out, connection dropped).
Answer = Reply | Any | None


class TransportError(WorkbenchError, RuntimeError):
    """A target cannot be reached (no listener). Raised before anything was sent to any target."""


class Transport(Protocol):
    def check(self, targets: Iterable[WorkerId]) -> None:
        """Raise TransportError if a target has no listener. Sends nothing."""

    def exchange(self, requests: Mapping[WorkerId, Request],
                 timeout: float) -> Mapping[WorkerId, Answer]:
        """Send every request at once; each reply, or None where none came within ``timeout``."""

    def now(self) -> float: ...


class FanOutDevice:
    """What the page allocator asks of a device, answered for a set of workers: the clock and
    the smallest headroom any target reported (a page must fit on every one)."""

    def __init__(self, name: str, granularity: int, clock: Callable[[], float]):
        self.name = name
        self.granularity = granularity
        self._clock = clock
        self.info: dict[WorkerId, MemInfo] = {}

    def now(self) -> float:
        return self._clock()

    @property
    def busy_s(self) -> float:
        return 0.0

    def mem_info(self) -> MemInfo:
        if not self.info:
            return MemInfo(1 << 62, 1 << 62)
        return min(self.info.values(), key=lambda m: m.free)
