"""Revisioned memory limits: every request carries a revision, every answer says what happened.

The outcomes and the rules that refuse a request live here; the ledger
(:meth:`~workbench.core.ledger.KVCacheManager.set_limit`) applies the rest.
"""

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


MAX_REVISION = (1 << 62) - 1  # control segments carry revisions as int64


def _plain_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def refusal(limit: object, revision: object, *, revision_now: int, limit_now: int,
            capacity: int, page_id_bytes: int, failed: bool) -> tuple[LimitOutcome, str] | None:
    """Why a pool at ``revision_now`` holding ``limit_now`` bytes does not apply this request:
    STALE, CONFLICT or REJECTED with the reason, APPLIED for the revision in force asked again
    (nothing to do), or None: apply it. The checks run in this order."""
    if revision is not None and (not _plain_int(revision)
                                 or not 0 <= revision <= MAX_REVISION):
        return LimitOutcome.REJECTED, f"revision {revision!r} is not an int in [0, {MAX_REVISION}]"
    if not _plain_int(limit):
        return LimitOutcome.REJECTED, f"limit {limit!r} is not an int"
    if revision is not None and revision < revision_now:
        return LimitOutcome.STALE, f"revision {revision} < {revision_now}"
    if revision == revision_now and revision is not None and revision_now:
        if limit == limit_now:
            return LimitOutcome.APPLIED, ""
        return LimitOutcome.CONFLICT, f"revision {revision} already set {limit_now} bytes"
    if limit < 0:
        return LimitOutcome.REJECTED, f"limit {limit!r} is negative"
    if limit > capacity:
        return LimitOutcome.REJECTED, f"limit {limit} exceeds the pool's capacity {capacity}"
    if limit // page_id_bytes < 1:
        return LimitOutcome.REJECTED, (f"limit {limit} is below one page id ({page_id_bytes} "
                                       f"bytes); the null block lives on page 0")
    if failed:
        return LimitOutcome.REJECTED, "the pool has failed"
    return None
