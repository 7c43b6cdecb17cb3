"""Reading an op trace: every line is checked against its op's schema before anything runs.

A line names a known op and only that op's fields; each value has the field's type (an id or a
count is an ``int``: ``2.0`` and ``true`` are refused) and lies in its range; a size is a byte
count or a string like ``"64MiB"``. A ``pool`` line is built into its geometry and config here, so
an impossible pool is refused with its line number before any device call. The first bad line
stops the load with one :class:`ConfigError` line: ``trace.jsonl:7: ...``.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from workbench.config import PoolConfig
from workbench.core.device import VMM_OPS
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.limits import MAX_REVISION
from workbench.errors import ConfigError
from workbench.knobs import KNOBS, Refused
from workbench.units import MAX_SIZE, MiB, PiB, parse_size

MAX_TRACE_BYTES = 64 << 20
MAX_BLOCKS = 1 << 20  # a pool's page table is a Python list: keep one trace line cheap
MAX_VIRTUAL = 1 << 44  # 16 TiB of address space per pool, well inside a 47-bit user space
PRESETS = ("h200", "h100", "a100")
TRACE_DEFAULTS = {"min_reserved": 2, "max_reserved": 4, "gpu_utilization": 1.0}
# a pool line's field -> the configuration knob it sets (workbench.knobs)
KNOB_FIELDS = {"page_size": "page_size", "min_reserved": "min_reserved_pages",
               "max_reserved": "max_reserved_pages", "prealloc": "prealloc",
               "memory_limit": "memory_limit", "gpu_utilization": "gpu_utilization",
               "ipc_name": "ipc_name"}
_INTERNAL = ("_line", "_geometry", "_config")  # what checking adds; a second check redoes it
Check = Callable[[Any], Any]


class _Bad(ValueError):
    """A field's value is refused; the text says what is accepted, ``why`` why not."""

    def __init__(self, accepted: str, why: str = "refused"):
        super().__init__(accepted)
        self.why = why


def _knob(name: str) -> Check:
    """A pool field that is a configuration knob: the knob's own check and refusal text, the
    same as ``PoolConfig(...)`` and ``WORKBENCH_KV_*`` give."""
    knob = KNOBS[name]

    def check(v: Any) -> Any:
        try:
            return knob.check(v)
        except Refused as why:
            raise _Bad(knob.accepted, str(why)) from None
    return check


def _count(lo: int, hi: int) -> Check:
    def check(v: Any) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise _Bad(f"an integer from {lo} to {hi}")
        return v
    return check


def _size(lo: int, hi: int, granule: int = 1) -> Check:
    def check(v: Any) -> int:
        want = f"a size from {lo} to {hi} bytes" + (
            f" in multiples of {granule // MiB} MiB" if granule > 1 else "")
        if isinstance(v, bool) or not isinstance(v, (int, str)) or len(str(v)) > 40:
            raise _Bad(want + " (a byte count or a string like \"64MiB\")")
        try:
            n = parse_size(v)
        except ConfigError:
            raise _Bad(want + " (a byte count or a string like \"64MiB\")") from None
        if not lo <= n <= hi or n % granule:
            raise _Bad(want)
        return n
    return check


def _choice(*values: Any) -> Check:
    def check(v: Any) -> Any:
        if isinstance(v, bool) or v not in values or type(v) is not type(values[0]):
            raise _Bad("one of " + ", ".join(json.dumps(x) for x in values))
        return v
    return check


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad("true or false")
    return v


def _name(v: Any) -> str:
    if not isinstance(v, str) or not 1 <= len(v) <= 64 or not v.isprintable():
        raise _Bad("a string of 1-64 printable characters")
    return v


def _ids(v: Any) -> list[int]:
    each = _count(0, MAX_BLOCKS)
    if not isinstance(v, list) or len(v) > MAX_BLOCKS:
        raise _Bad(f"a list of block ids (integers from 0 to {MAX_BLOCKS})")
    try:
        return [each(b) for b in v]
    except _Bad:
        raise _Bad(f"a list of block ids (integers from 0 to {MAX_BLOCKS})") from None


_POOL = {"pool": _name}
SCHEMA: dict[str, tuple[dict[str, Check], tuple[str, ...]]] = {  # op -> (fields, required)
    "device": ({"preset": _choice(*PRESETS), "capacity": _size(2 * MiB, PiB)}, ()),
    "pool": ({**_POOL, "num_layers": _count(1, 512), "kv_heads": _count(1, 1024),
              "head_dim": _count(1, 4096), "block_size": _count(1, 4096),
              "num_blocks": _count(2, MAX_BLOCKS), "layout": _choice("contiguous", "per_layer"),
              "mla": _flag, **{f: _knob(k) for f, k in KNOB_FIELDS.items()},
              "dtype_bytes": _choice(1, 2, 4)},
             ("pool",)),
    "alloc": ({**_POOL, "n": _count(0, MAX_BLOCKS), "tag": _name}, ("pool", "n")),
    "free": ({**_POOL, "tag": _name, "ids": _ids}, ("pool",)),
    "limit": ({**_POOL, "bytes": _size(0, MAX_SIZE), "revision": _count(0, MAX_REVISION)},
              ("pool", "bytes")),
    "trim": (_POOL, ("pool",)),
    "refill": (_POOL, ("pool",)),
    "fail": ({"call": _choice(*VMM_OPS), "nth": _count(1, 1 << 20)}, ("call",)),
    "occupy": ({"owner": _name, "bytes": _size(0, PiB)}, ("owner", "bytes")),
    "close": (_POOL, ("pool",)),
}
OPS = tuple(SCHEMA)


def check_op(op: Any, where: str) -> dict:
    """``op`` with every field checked (sizes as ints; a pool line gains ``_geometry`` and
    ``_config``), or a one-line ConfigError naming ``where`` (``file:line``) and the field."""
    if not isinstance(op, dict):
        raise ConfigError(where, f"not a JSON object ({type(op).__name__})",
                          "write one {\"op\": ...} object per line")
    kind = op.get("op")
    if not isinstance(kind, str) or kind not in SCHEMA:
        raise ConfigError(where, f"unknown op {_short(kind)}", f"use one of {', '.join(OPS)}")
    fields, required = SCHEMA[kind]
    out: dict[str, Any] = {"op": kind}
    for key, value in op.items():
        if key == "op":
            continue
        if key not in fields:
            raise ConfigError(where, f"unknown field {_short(key)} for op {kind!r}",
                              f"use only {', '.join(fields) or 'no fields'}")
        try:
            out[key] = fields[key](value)
        except _Bad as bad:
            raise ConfigError(f"{where}: {kind} {key}={_short(value)}", bad.why,
                              f"use {bad}") from None
    missing = [k for k in required if k not in out]
    if missing:
        raise ConfigError(where, f"op {kind!r} lacks {', '.join(missing)}",
                          f"add {', '.join(missing)}")
    if kind == "free" and ("tag" in out) == ("ids" in out):
        raise ConfigError(where, "a free names either a tag or ids (exactly one)",
                          "write \"tag\": \"r1\" or \"ids\": [3, 4]")
    if kind == "pool":
        try:
            out["_geometry"], out["_config"] = _pool_parts(out)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err.what}", err.why, err.fix) from None
    return out


def _pool_parts(op: dict) -> tuple[KVGeometry, PoolConfig]:
    layout = Layout(op.get("layout", "contiguous"))
    geo = KVGeometry.for_model(
        num_layers=op.get("num_layers", 4), kv_heads=op.get("kv_heads", 8),
        head_dim=op.get("head_dim", 128), mla=op.get("mla", False),
        block_size=op.get("block_size", 16), num_blocks=op.get("num_blocks", 1024),
        page_size=op.get("page_size", KNOBS["page_size"].default), layout=layout,
        dtype_bytes=op.get("dtype_bytes", 2))
    if geo.virtual_bytes > MAX_VIRTUAL:
        raise ConfigError(f"pool of {geo.virtual_bytes} virtual bytes",
                          f"more than {MAX_VIRTUAL} bytes of address space",
                          "use fewer blocks, layers or heads")
    limit = op.get("memory_limit")
    if limit is not None and limit < geo.page_id_bytes:
        raise ConfigError(f"memory_limit={limit}", f"below one page id ({geo.page_id_bytes} "
                          "bytes), where the null block lives", "raise it or leave it unset")
    # a trace's own defaults (docs/replay.md): part of the trace format, so that a recorded
    # trace replays the same; every value still passes the knobs' checks in PoolConfig
    cfg = PoolConfig(page_size=geo.page_size, contiguous_layout=layout is Layout.CONTIGUOUS,
                     prealloc=op.get("prealloc", True),
                     min_reserved_pages=op.get("min_reserved", TRACE_DEFAULTS["min_reserved"]),
                     max_reserved_pages=op.get("max_reserved", TRACE_DEFAULTS["max_reserved"]),
                     memory_limit=limit,
                     gpu_utilization=op.get("gpu_utilization",
                                            TRACE_DEFAULTS["gpu_utilization"]),
                     ipc_name=op.get("ipc_name"))
    return geo, cfg


def check_trace(ops: Iterable[Any], source: str = "trace") -> list[dict]:
    """Every op checked, and the trace as a whole: ``device`` only first, pool names unique.
    Ops may carry ``_line`` (their line in ``source``); others are numbered from 1."""
    out: list[dict] = []
    names: dict[str, int] = {}
    for i, op in enumerate(ops, 1):
        line = op.get("_line", i) if isinstance(op, dict) else i
        line = line if isinstance(line, int) and not isinstance(line, bool) else i
        where = f"{source}:{line}"
        checked = check_op({k: v for k, v in op.items() if k not in _INTERNAL}
                           if isinstance(op, dict) else op, where)
        if checked["op"] == "device" and out:
            raise ConfigError(where, "a device op is allowed only as the first op",
                              "move it to the top of the trace")
        if checked["op"] == "pool":
            name = checked["pool"]
            if name in names:
                raise ConfigError(where, f"pool {name!r} is already created on line "
                                  f"{names[name]}", "give each pool its own name")
            names[name] = line
        checked["_line"] = line
        out.append(checked)
    return out


def load_trace(path: str | Path) -> list[dict]:
    """Read and check a JSON-lines trace; blank lines and ``#`` lines are skipped."""
    path = Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read forever
            raise ConfigError(str(path), "not a regular file", "pass a trace file")
        if st.st_size > MAX_TRACE_BYTES:
            raise ConfigError(str(path), f"larger than {MAX_TRACE_BYTES} bytes",
                              "split the trace")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(str(path), f"cannot be read ({type(err).__name__})",
                          "pass a readable UTF-8 JSON-lines file") from None
    ops = []
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            op = json.loads(line)
        except (ValueError, RecursionError) as err:  # a 5000-digit number is a ValueError
            why = f"not JSON ({err.msg})" if isinstance(err, json.JSONDecodeError) else \
                f"not readable JSON ({type(err).__name__})"
            raise ConfigError(f"{path}:{i}", why, "write one JSON object per line") from None
        if not isinstance(op, dict):
            raise ConfigError(f"{path}:{i}", f"not a JSON object ({type(op).__name__})",
                              "write one {\"op\": ...} object per line")
        op["_line"] = i
        ops.append(op)
    return check_trace(ops, str(path))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:36] + "..."
