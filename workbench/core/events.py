"""Typed state events: every page transition, limit outcome and pool failure is one :class:`Event`.

The event trace is what plots draw, what ``replay`` prints and what the differential test compares
across backends (``Event.key()`` drops the timestamp).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from enum import Enum
from functools import partial
from typing import NamedTuple


class PageState(str, Enum):
    """The VMM page state machine (seed 001 §8).

    FREE: no physical backing (the zero page shows through).
    RESERVED: mapped, holds no live block; ready to hand out without a map.
    IN_USE: mapped, at least one block issued from it.
    RETIRED: empty but still mapped until every worker passes its release barrier.
    RECLAIMED: outside the pool's current limit (a shrink took it); may come back on a grow.
    QUARANTINED: a failed rollback left its backing unknown; never issued again.
    """

    FREE = "free"
    RESERVED = "reserved"
    IN_USE = "in_use"
    RETIRED = "retired"
    RECLAIMED = "reclaimed"
    QUARANTINED = "quarantined"


class Event(NamedTuple):
    t: float
    pool: str
    page: int  # -1 for pool-level events
    src: str
    dst: str
    cause: str

    def key(self) -> tuple[str, int, str, str, str]:
        """The event without its time: equal across backends for the same op trace."""
        return (self.pool, self.page, self.src, self.dst, self.cause)

    def to_json(self) -> str:
        return json.dumps(self._asdict(), separators=(",", ":"))


# ``Event(...)`` runs namedtuple's Python-level ``__new__``; the page allocator emits one event per
# transition on the alloc/free hot path, so it builds them from a plain 6-tuple with the C-level
# tuple constructor instead (half the cost, the same Event).
event_from_tuple: Callable[[tuple[float, str, int, str, str, str]], Event] = \
    partial(tuple.__new__, Event)


class EventLog:
    """An append-only list of events with subscribers (plots subscribe to watch a run live).

    Several pools may share one log (a replay, a recording). A subscriber that acts on one pool's
    events (its control segment writes page states by index) subscribes with ``pool=name`` and
    is routed only that pool's events: another pool's page 900 never reaches a 64-page segment.
    """

    def __init__(self, keep: bool = True):
        self.events: list[Event] = []
        self.keep = keep
        self._subscribers: list[Callable[[Event], None]] = []
        self._routes: dict[str, list[Callable[[Event], None]]] = {}  # pool -> its subscribers

    def emit(self, event: Event) -> None:
        if self.keep:
            self.events.append(event)
        for fn in self._subscribers:
            fn(event)
        if self._routes:
            for fn in self._routes.get(event[1], ()):  # event[1] is the pool (hot path)
                fn(event)

    def subscribe(self, fn: Callable[[Event], None],
                  pool: str | None = None) -> Callable[[], None]:
        """Call ``fn`` on every event, or only on ``pool``'s events. Returns the unsubscribe."""
        if pool is None:
            self._subscribers.append(fn)
            return lambda: self._subscribers.remove(fn)
        self._routes.setdefault(pool, []).append(fn)
        return lambda: self._unroute(pool, fn)

    def _unroute(self, pool: str, fn: Callable[[Event], None]) -> None:
        fns = self._routes[pool]
        fns.remove(fn)
        if not fns:
            del self._routes[pool]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def keys(self) -> list[tuple[str, int, str, str, str]]:
        return [e.key() for e in self.events]
