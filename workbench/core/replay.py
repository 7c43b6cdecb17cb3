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
    {"op": "occupy", "owner": "weights", "bytes": "1G"}            sim only: memory outside pools
    {"op": "close", "pool": "a"}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

from workbench.config import PoolConfig, parse_size
from workbench.core.device import Device, FaultyDevice
from workbench.core.events import EventLog
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager, PoolSnapshot
from workbench.errors import ConfigError, WorkbenchError

OPS = ("device", "pool", "alloc", "free", "limit", "trim", "refill", "fail", "occupy", "close")


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


def load_trace(path: str | Path) -> list[dict]:
    ops = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            op = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}:{i}", f"not JSON ({err.msg})",
                              "write one JSON object per line") from err
        if not isinstance(op, dict) or op.get("op") not in OPS:
            got = op.get("op") if isinstance(op, dict) else op
            raise ConfigError(f"{path}:{i}", f"unknown op {got!r}", f"use one of {', '.join(OPS)}")
        op["_line"] = i
        ops.append(op)
    return ops


def _pool_from(op: dict, device: Device, events: EventLog) -> KVCacheManager:
    layout = Layout(op.get("layout", "contiguous"))
    geo = KVGeometry.for_model(
        num_layers=op.get("num_layers", 4), kv_heads=op.get("kv_heads", 8),
        head_dim=op.get("head_dim", 128), mla=op.get("mla", False),
        block_size=op.get("block_size", 16), num_blocks=op.get("num_blocks", 1024),
        page_size=parse_size(op.get("page_size", 2 << 20)), layout=layout,
        dtype_bytes=op.get("dtype_bytes", 2))
    limit = op.get("memory_limit")
    cfg = PoolConfig(page_size=geo.page_size, contiguous_layout=layout is Layout.CONTIGUOUS,
                     prealloc=op.get("prealloc", True),
                     min_reserved_pages=op.get("min_reserved", 2),
                     max_reserved_pages=op.get("max_reserved", 4),
                     memory_limit=None if limit is None else parse_size(limit),
                     gpu_utilization=op.get("gpu_utilization", 1.0),
                     ipc_name=op.get("ipc_name"))
    return KVCacheManager(geo, device, name=op["pool"], config=cfg, events=events)


def replay(ops: Iterable[dict], make_device: Callable[..., Device],
           events: EventLog | None = None) -> ReplayResult:
    """Run ``ops`` against a device made by ``make_device(**device_op_fields)``."""
    events = events if events is not None else EventLog()
    ops = list(ops)
    dev_kw = {}
    if ops and ops[0].get("op") == "device":
        first = ops.pop(0)
        dev_kw = {k: v for k, v in first.items() if k not in ("op", "_line")}
        if "capacity" in dev_kw:
            dev_kw["capacity"] = parse_size(dev_kw["capacity"])
    device = FaultyDevice(make_device(**dev_kw))
    pools: dict[str, KVCacheManager] = {}
    tags: dict[tuple[str, str], list[int]] = {}
    results: list[OpResult] = []

    def pool_of(op: dict) -> KVCacheManager:
        name = op.get("pool")
        if name not in pools:
            raise ConfigError(f"line {op.get('_line')}: pool {name!r}", "not created",
                              "add a {\"op\": \"pool\"} line first")
        return pools[name]

    for op in ops:
        kind, line, name = op["op"], op.get("_line", 0), op.get("pool")
        try:
            if kind == "pool":
                pools[name] = _pool_from(op, device, events)
                res: Any = pools[name].snapshot(with_pages=False).counts
            elif kind == "alloc":
                ids = pool_of(op).alloc(int(op["n"]))
                if ids is not None and op.get("tag"):
                    tags[(name, op["tag"])] = ids
                res = None if ids is None else len(ids)
            elif kind == "free":
                ids = tags.pop((name, op["tag"]), []) if "tag" in op else op.get("ids", [])
                pool_of(op).free(ids)
                res = len(ids)
            elif kind == "limit":
                res = pool_of(op).set_limit(parse_size(op["bytes"]), op.get("revision")).to_dict()
            elif kind == "trim":
                res = pool_of(op).trim()
            elif kind == "refill":
                res = pool_of(op).pages.refill()
            elif kind == "fail":
                device.fail_next(op["call"], int(op.get("nth", 1)))
                res = op["call"]
            elif kind == "occupy":
                device.occupy(op["owner"], parse_size(op["bytes"]))
                res = op["owner"]
            elif kind == "close":
                pool_of(op).close()
                res = "closed"
            else:  # "device" anywhere but first
                raise ConfigError(f"line {line}: device op", "only allowed as the first op",
                                  "move it to the top of the trace")
        except WorkbenchError as err:
            if isinstance(err, ConfigError) and kind in ("pool", "device"):
                raise
            res = {"error": type(err).__name__, "message": str(err)}
        results.append(OpResult(line, kind, name, res))
    snaps = {n: p.snapshot() for n, p in pools.items()}
    # give the memory back (a GPU holds it until the process ends otherwise), off the record
    events.keep = False
    for pool in pools.values():
        try:
            pool.close()
        except WorkbenchError:
            pass
    events.keep = True
    return ReplayResult(events, results, snaps)
