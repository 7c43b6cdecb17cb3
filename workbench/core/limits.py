"""Revisioned memory limits: every request carries a revision, every answer says what happened."""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


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
