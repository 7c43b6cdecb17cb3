"""A recording: the event trace of one or more pools, cut into named steps.

Plots read only this: page states at a step are the fold of every event up to it, so what a plot
shows is exactly what the core emitted. ``mark(label)`` closes a step and also keeps a snapshot of
each pool's limit (a pool-level number the page fold does not carry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from workbench.core.events import Event, EventLog, PageState
from workbench.errors import ConfigError

STATES = [s.value for s in PageState]
MAPPED = ("in_use", "reserved", "retired")


def limit_in_force(kv) -> int:
    """The pool's limit in bytes, or 0 when none was ever set: an unset limit reads as the
    pool's capacity, which a plot must not label "limit"."""
    return kv.limit_bytes if getattr(kv, "revision", 0) > 0 else 0


@dataclass(slots=True)
class PoolInfo:
    name: str
    num_pages: int
    page_id_bytes: int
    blocks_per_page: int = 0


class Step(NamedTuple):
    label: str
    end: int  # events[:end] happened by the end of this step
    t: float
    limits: dict[str, int]  # pool -> limit bytes in force (0: no limit set)


@dataclass
class Recording:
    log: EventLog = field(default_factory=EventLog)
    pools: dict[str, PoolInfo] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    managers: dict[str, object] = field(default_factory=dict)
    _cache: dict[int, dict[str, list[str]]] = field(default_factory=dict)

    # -- building --------------------------------------------------------------------------
    def add_pool(self, kv) -> None:
        """Register a KVCacheManager built with ``events=self.log``."""
        if kv.events is not self.log:
            raise ConfigError(f"pool {kv.name!r}", "it writes to another EventLog, so the "
                              "recording would miss its events",
                              "build it with events=recording.log")
        g = kv.geometry
        self.pools[kv.name] = PoolInfo(kv.name, g.num_pages, g.page_id_bytes,
                                       g.page_size // g.block_bytes)
        self.managers[kv.name] = kv

    def mark(self, label: str) -> int:
        """Close a step; returns its index."""
        limits = {n: limit_in_force(m) for n, m in self.managers.items()}
        t = self.log.events[-1].t if self.log.events else 0.0
        self.steps.append(Step(label, len(self.log.events), t, limits))
        return len(self.steps) - 1

    @property
    def events(self) -> list[Event]:
        return self.log.events

    # -- reading ---------------------------------------------------------------------------
    def _end(self, step: int | None) -> int:
        if not self.steps or step is None:
            return len(self.events)
        return self.steps[max(0, min(step, len(self.steps) - 1))].end

    def states_at(self, step: int | None = None) -> dict[str, list[str]]:
        """Page states of every pool after ``step`` (None: after the last event)."""
        end = self._end(step)
        if end in self._cache:
            return {k: list(v) for k, v in self._cache[end].items()}
        states = {n: ["free"] * p.num_pages for n, p in self.pools.items()}
        for e in self.events[:end]:
            if e.page >= 0 and e.pool in states and e.dst in STATES:
                states[e.pool][e.page] = e.dst
        self._cache[end] = states
        return {k: list(v) for k, v in states.items()}

    def last_event(self, pool: str, page: int, step: int | None = None) -> Event | None:
        for e in reversed(self.events[:self._end(step)]):
            if e.pool == pool and e.page == page:
                return e
        return None

    def series(self) -> dict[str, dict[str, list[float]]]:
        """Per pool and per step: mapped, reserved and in-use bytes (from the events) and the limit
        (from the step snapshot)."""
        out: dict[str, dict[str, list[float]]] = {
            n: {"mapped": [], "reserved": [], "in_use": [], "limit": []} for n in self.pools}
        counts = {n: {s: 0 for s in STATES} for n in self.pools}
        for n, p in self.pools.items():
            counts[n]["free"] = p.num_pages
        i = 0
        for step in self.steps:
            for e in self.events[i:step.end]:
                if e.page >= 0 and e.pool in counts and e.dst in STATES and e.src in STATES:
                    counts[e.pool][e.src] -= 1
                    counts[e.pool][e.dst] += 1
            i = step.end
            for n, p in self.pools.items():
                c, b = counts[n], p.page_id_bytes
                out[n]["mapped"].append(sum(c[s] for s in MAPPED) * b)
                out[n]["reserved"].append(c["reserved"] * b)
                out[n]["in_use"].append(c["in_use"] * b)
                out[n]["limit"].append(step.limits.get(n, 0))
        return out

    def labels(self) -> list[str]:
        return [s.label for s in self.steps]
