"""Op traces: a JSON-lines script of pool operations, replayed on any backend.

Replaying the same trace on two backends must give the same event keys (the differential test).
Format (one JSON object per line; sizes accept ``"64MiB"``, ``"8G"`` or plain bytes; blank lines
and lines starting with ``#`` are skipped)::

    {"op": "device", "preset": "h200", "capacity": "4G"}         optional, first: the sim device
    {"op": "pool", "pool": "a", "num_layers": 4, "kv_heads": 8, "head_dim": 128,
     "block_size": 16, "num_blocks": 1024, "layout": "contiguous", "mla": false,
     "min_reserved": 2, "max_reserved": 4, "prealloc": true, "memory_limit": "64MiB"}
    {"op": "alloc", "pool": "a", "n": 40, "tag": "r1"}            tag names the ids for a free
    {"op": "free", "pool": "a", "tag": "r1"}                       or "ids": [3, 4]
    {"op": "limit", "pool": "a", "bytes": "32MiB", "revision": 7}  revision optional
    {"op": "trim", "pool": "a"}
    {"op": "refill", "pool": "a"}
    {"op": "fail", "call": "map", "nth": 1}   the nth next call of that kind fails
    {"op": "occupy", "owner": "weights", "bytes": "1G"}            sim, gpu: memory outside pools
    {"op": "close", "pool": "a"}

Every line is checked before anything runs (``workbench.core.trace``): a bad line stops the load
with one ``file:line: ...`` error. At run time an op that fails records ``{"error", "message"}``
as its result and the replay goes on; a pool that cannot be created stops it. Either way, when
``replay`` returns or raises, every pool it opened is closed and the device holds nothing it made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any, NamedTuple

from workbench.core.device import Device, FaultyDevice
from workbench.core.events import EventLog
from workbench.core.ledger import KVCacheManager
from workbench.core.ledger_state import PoolSnapshot
from workbench.core.trace import OPS, check_trace, load_trace
from workbench.errors import ConfigError, DeviceError, WorkbenchError

__all__ = ["OPS", "OpResult", "ReplayResult", "load_trace", "replay"]


class OpResult(NamedTuple):
    line: int
    op: str
    pool: str | None
    result: Any


class ReplayResult(NamedTuple):
    events: EventLog
    results: list[OpResult]
    pools: dict[str, PoolSnapshot]

    def to_dict(self) -> dict:
        return {
            "events": [e._asdict() for e in self.events],
            "results": [r._asdict() for r in self.results],
            "pools": {n: asdict(s) for n, s in self.pools.items()},
        }


class _TracedDevice(FaultyDevice):
    """The replay's device: faults on demand, and a record of every reservation, allocation and
    mapping still live, so that whatever a failed close left behind is given back at the end."""

    def __init__(self, inner: Device):
        super().__init__(inner)
        self.live_res: dict[int, int] = {}  # va -> size
        self.live_handles: set[int] = set()
        self.live_maps: dict[int, int] = {}  # va -> size

    def reserve(self, size: int) -> int:
        va = super().reserve(size)
        self.live_res[va] = size
        return va

    def unreserve(self, va: int, size: int) -> None:
        super().unreserve(va, size)
        self.live_res.pop(va, None)

    def create(self, size: int) -> int:
        h = super().create(size)
        self.live_handles.add(h)
        return h

    def map(self, va: int, size: int, handle: int) -> None:
        super().map(va, size, handle)
        self.live_maps[va] = size

    def unmap(self, va: int, size: int) -> None:
        super().unmap(va, size)
        self.live_maps.pop(va, None)

    def release(self, handle: int) -> None:
        super().release(handle)
        self.live_handles.discard(handle)

    def sweep(self) -> None:
        """Give back what is still live, faults off: mappings, then handles, then ranges."""
        self.plan.clear()
        for va, size in list(self.live_maps.items()):
            _quietly(self.unmap, va, size)
        for h in list(self.live_handles):
            _quietly(self.release, h)
        for va, size in list(self.live_res.items()):
            _quietly(self.unreserve, va, size)


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except DeviceError:
        pass


class _Run:
    """One replay's state: its device, pools, tags, occupied owners and results."""

    def __init__(self, device: _TracedDevice, events: EventLog):
        self.device, self.events = device, events
        self.pools: dict[str, KVCacheManager] = {}
        self.tags: dict[tuple[str, str], list[int] | int] = {}  # ids, or a missed alloc's line
        self.occupied: set[str] = set()
        self.results: list[OpResult] = []

    def pool_of(self, op: dict) -> KVCacheManager:
        name = op["pool"]
        if name not in self.pools:
            raise ConfigError(f"line {op['_line']}: pool {name!r}", "not created",
                              "add a {\"op\": \"pool\"} line first")
        return self.pools[name]

    def step(self, op: dict) -> None:
        kind = op["op"]
        try:
            res = getattr(self, "_" + kind)(op)
        except WorkbenchError as err:
            if isinstance(err, ConfigError) and kind == "pool":
                raise ConfigError(f"line {op['_line']}: {err.what}", err.why, err.fix) from None
            res = {"error": type(err).__name__, "message": str(err)}
        self.results.append(OpResult(op["_line"], kind, op.get("pool"), res))

    def _pool(self, op: dict) -> Any:
        kv = KVCacheManager(op["_geometry"], self.device, name=op["pool"], config=op["_config"],
                            events=self.events)
        self.pools[op["pool"]] = kv
        return kv.snapshot(with_pages=False).counts

    def _alloc(self, op: dict) -> Any:
        ids = self.pool_of(op).alloc(op["n"])
        if "tag" in op:  # a miss is remembered too: its free says so instead of freeing []
            self.tags[(op["pool"], op["tag"])] = ids if ids is not None else op["_line"]
        return None if ids is None else len(ids)

    def _free(self, op: dict) -> Any:
        kv = self.pool_of(op)
        ids = self.tags.get((op["pool"], op["tag"]), []) if "tag" in op else op["ids"]
        if isinstance(ids, int):
            self.tags.pop((op["pool"], op["tag"]), None)
            raise ConfigError(f"line {op['_line']}: free tag {op['tag']!r}", f"its alloc on "
                              f"line {ids} missed (answered null), so it holds no blocks",
                              "nothing was freed; check the alloc's result first")
        kv.free(ids)
        if "tag" in op:  # forgotten only once freed: a refused free can be retried
            self.tags.pop((op["pool"], op["tag"]), None)
        return len(ids)

    def _limit(self, op: dict) -> Any:
        return self.pool_of(op).set_limit(op["bytes"], op.get("revision")).to_dict()

    def _trim(self, op: dict) -> Any:
        return self.pool_of(op).trim()

    def _refill(self, op: dict) -> Any:
        return self.pool_of(op).refill()

    def _fail(self, op: dict) -> Any:
        self.device.fail_next(op["call"], op.get("nth", 1))
        return op["call"]

    def _occupy(self, op: dict) -> Any:
        if not callable(getattr(self.device.inner, "occupy", None)):
            raise ConfigError(f"line {op['_line']}: occupy", "this device holds no memory "
                              "outside pools", "use occupy on the sim or gpu backend only")
        self.occupied.add(op["owner"])
        self.device.occupy(op["owner"], op["bytes"])
        return op["owner"]

    def _close(self, op: dict) -> Any:
        problems = self.pool_of(op).close()
        return "closed" if not problems else {"error": "DeviceError",
                                              "message": "; ".join(problems)}

    def release(self) -> None:
        """Close every pool and give back what the run holds, off the record."""
        keep, self.events.keep = self.events.keep, False
        self.device.plan.clear()  # a fault still pending must not fail the clean-up
        try:
            for kv in self.pools.values():
                try:
                    kv.close()
                except WorkbenchError:
                    pass
            for owner in self.occupied:
                try:
                    self.device.occupy(owner, 0)
                except WorkbenchError:
                    pass
            self.device.sweep()
        finally:
            self.events.keep = keep


def replay(ops: Iterable[Any], make_device: Callable[..., Device],
           events: EventLog | None = None) -> ReplayResult:
    """Check ``ops``, then run them against a device made by ``make_device(**device_op_fields)``.
    Raises a one-line ConfigError for a bad op (nothing run) or a pool that cannot be created
    (everything opened so far closed again)."""
    checked = check_trace(ops)
    events = events if events is not None else EventLog()
    dev_kw: dict[str, Any] = {}
    line = 1
    if checked and checked[0]["op"] == "device":
        first = checked.pop(0)
        line = first["_line"]
        dev_kw = {k: v for k, v in first.items() if k != "op" and k[0] != "_"}
    try:
        device = make_device(**dev_kw)
    except TypeError:  # a backend without presets (host, gpu) given a device op
        raise ConfigError(f"line {line}: device op", f"this backend takes no {', '.join(dev_kw)}",
                          "drop the device line (it describes the simulated GPU)") from None
    run = _Run(_TracedDevice(device), events)
    try:
        for op in checked:
            run.step(op)
        snaps = {n: p.snapshot() for n, p in run.pools.items()}
    finally:
        run.release()
    return ReplayResult(events, run.results, snaps)
