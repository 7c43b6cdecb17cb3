"""Prometheus metrics of elastic KV pools, shared by the mini server's ``/metrics`` and
``workbench kvctl export``, so a pool reads the same in both and in any dashboard built on them.

Each pool is one label value (``pool="..."``) on the ``workbench_kv_*_bytes`` gauges. Values are
read at scrape time through a callback, never cached, and every registry here is private to its
server: nothing is added to prometheus-client's global registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

# (field of PoolReading, metric name, help)
KV_METRICS = (
    ("mapped", "workbench_kv_mapped_bytes",
     "Bytes of the pool's pages mapped to physical memory (in use, reserved or retired)."),
    ("reserved", "workbench_kv_reserved_bytes",
     "Bytes of mapped pages that hold no block (kept warm for the next allocation)."),
    ("limit", "workbench_kv_limit_bytes", "The pool's memory limit in bytes."),
    ("used", "workbench_kv_used_bytes", "Bytes of pages that hold at least one block."),
    ("capacity", "workbench_kv_capacity_bytes", "The pool's virtual capacity in bytes."),
)


@dataclass(frozen=True, slots=True)
class PoolReading:
    """One pool's sizes at one moment, in bytes."""

    pool: str
    mapped: int
    reserved: int
    limit: int
    used: int
    capacity: int


def kv_families(readings: Iterable[PoolReading]) -> list[Metric]:
    """The ``workbench_kv_*_bytes`` gauges, one sample per pool."""
    fams = {f: GaugeMetricFamily(name, doc, labels=["pool"]) for f, name, doc in KV_METRICS}
    for r in readings:
        for f, fam in fams.items():
            fam.add_metric([r.pool], float(getattr(r, f)))
    return list(fams.values())


def reading_of_manager(manager) -> PoolReading:
    """A live ``KVCacheManager`` (call from the thread that owns it)."""
    snap = manager.snapshot(with_pages=False)
    return PoolReading(pool=manager.name, mapped=snap.mapped_bytes,
                       reserved=snap.reserved_bytes, limit=snap.limit_bytes,
                       used=snap.counts["in_use"] * snap.page_id_bytes,
                       capacity=manager.capacity_bytes)


def readings_from_segments() -> list[PoolReading]:
    """Every pool on this host with a control segment, as ``read_all`` returns them (it skips
    foreign and malformed segments; so does the exporter)."""
    from workbench.core import control

    return [PoolReading(pool=i.name, mapped=i.mapped, reserved=i.reserved, limit=i.limit,
                        used=i.used, capacity=i.capacity) for i in control.read_all()]


class CallbackCollector(Collector):
    """Metric families computed by ``fn`` at every scrape."""

    def __init__(self, fn: Callable[[], Iterable[Metric]]):
        self.fn = fn

    def collect(self) -> Iterator[Metric]:
        yield from self.fn()

    def describe(self) -> list[Metric]:
        return []  # names are dynamic; do not collect at registration


def export_registry() -> CollectorRegistry:
    """The registry ``workbench kvctl export`` serves: every pool on the host."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CallbackCollector(lambda: kv_families(readings_from_segments())))
    return reg
