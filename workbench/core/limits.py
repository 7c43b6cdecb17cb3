"""Revisioned memory limits: every request carries a revision, every answer says what happened."""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from workbench.core.events import Event


class LimitOutcome(str, Enum):
    APPLIED = "applied"  # the pool already fits the limit
    DEFERRED = "deferred"  # shrinking: converges as live blocks are freed
    STALE = "stale"  # an older revision than the one in force: ignored
    CONFLICT = "conflict"  # same revision, different limit: ignored
    REJECTED = "rejected"  # impossible (negative, above capacity, below the null block's page)


class LimitResult(NamedTuple):
    outcome: LimitOutcome
    limit: int  # bytes in force after this request
    revision: int  # revision in force after this request
    target_pages: int
    reason: str = ""

    def to_dict(self) -> dict:
        d = self._asdict()
        d["outcome"] = self.outcome.value
        return d


MAX_REVISION = (1 << 62) - 1  # control segments carry revisions as int64


def _plain_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class PoolLimits:
    """The limit half of :class:`~workbench.core.ledger.KVCacheManager` (mixed into it): every
    request is answered with a :class:`LimitResult` and recorded as an event; impossible values
    are rejected, never raised, so a remote caller always gets an answer."""

    def set_limit(self, limit: int, revision: int | None = None) -> LimitResult:
        """Ask the pool to hold at most ``limit`` bytes. See :class:`LimitOutcome`."""
        self._check_open()
        if revision is not None and (not _plain_int(revision)
                                     or not 0 <= revision <= MAX_REVISION):
            return self._limit_event(LimitOutcome.REJECTED,
                                     f"revision {revision!r} is not an int in [0, {MAX_REVISION}]")
        if not _plain_int(limit):
            return self._limit_event(LimitOutcome.REJECTED, f"limit {limit!r} is not an int")
        if revision is not None and revision < self.revision:
            return self._limit_event(LimitOutcome.STALE, f"revision {revision} < "
                                                         f"{self.revision}")
        if revision == self.revision and revision is not None and self.revision:
            if limit == self.limit_bytes:
                return self._pending or self._state(LimitOutcome.APPLIED)
            return self._limit_event(LimitOutcome.CONFLICT,
                                     f"revision {revision} already set {self.limit_bytes} bytes")
        if limit < 0:
            return self._limit_event(LimitOutcome.REJECTED, f"limit {limit!r} is negative")
        if limit > self.capacity_bytes:
            return self._limit_event(LimitOutcome.REJECTED,
                                     f"limit {limit} exceeds the pool's capacity "
                                     f"{self.capacity_bytes}")
        target = limit // self.geometry.page_id_bytes
        if target < 1:
            return self._limit_event(LimitOutcome.REJECTED,
                                     f"limit {limit} is below one page id "
                                     f"({self.geometry.page_id_bytes} bytes); the null block "
                                     f"lives on page 0")
        if self.pages.failed:
            return self._limit_event(LimitOutcome.REJECTED, "the pool has failed")
        return self._apply_limit(limit, target, revision)

    def _apply_limit(self, limit: int, target: int, revision: int | None) -> LimitResult:
        self.revision = revision if revision is not None else self.revision + 1
        self.limit_bytes = limit
        self.free_reserved()  # held blocks must not pin the tail
        done = self.pages.set_limit_pages(target)
        self.num_free = sum(len(s) for p, s in self.free_blocks.items() if p < target)
        self._pending = None if done else self._state(LimitOutcome.DEFERRED)
        result = self._pending or self._state(LimitOutcome.APPLIED)
        self._emit_limit(result)
        self._publish()
        return result

    def _state(self, outcome: LimitOutcome, reason: str = "") -> LimitResult:
        return LimitResult(outcome, self.limit_bytes, self.revision, self.pages.limit_pages,
                           reason)

    def _limit_event(self, outcome: LimitOutcome, reason: str) -> LimitResult:
        result = self._state(outcome, reason)
        self._emit_limit(result)
        return result

    def _emit_limit(self, r: LimitResult) -> None:
        self.events.emit(Event(self.device.now(), self.name, -1, f"limit@{r.revision}",
                               r.outcome.value, f"limit {r.limit} bytes -> {r.target_pages} pages"
                               + (f": {r.reason}" if r.reason else "")))

    def _converge(self) -> None:
        if self.pages.enforce_limit():
            self._pending = None
            self._emit_limit(self._state(LimitOutcome.APPLIED, "converged"))

    @property
    def limit_state(self) -> LimitResult:
        return self._pending or self._state(LimitOutcome.APPLIED)
