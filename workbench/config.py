"""Pool configuration: KVCacheD's knobs as one typed object, readable from ``WORKBENCH_KV_*``.

Our own prefix means an installed kvcached (``KVCACHED_*``) is never affected, nor affects us.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from workbench.errors import ConfigError

ENV_PREFIX = "WORKBENCH_KV_"
MiB = 1 << 20

_SIZE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """``8G``, ``512MiB``, ``1.5g``, ``4096`` → bytes (binary units). Raises ConfigError."""
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise ConfigError(f"size {text!r}", "not a size",
                              "write a number with an optional unit: 4096, 512MiB, 8G")
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < 0:
        raise ConfigError(f"size {text!r}", "is negative", "use a size of 0 or more")
    return value


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


_IPC = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def check_ipc_name(name: str) -> str:
    """IPC names become file names under /dev/shm: no separators, no dots-only, at most 64."""
    if not _IPC.match(name or "") or set(name) <= {"."}:
        raise ConfigError(f"IPC name {name!r}",
                          "must be 1-64 characters of letters, digits, '_', '-' or '.' "
                          "(no path separators)", "pick a name like 'llama_a'")
    return name


@dataclass(frozen=True, slots=True)
class PoolConfig:
    page_size: int = 2 * MiB
    contiguous_layout: bool = True
    prealloc: bool = True
    min_reserved_pages: int = 5
    max_reserved_pages: int = 10
    max_cached_tokens: int = -1  # -1 unlimited, 0 evict at once, N bounded
    ipc_name: str | None = None
    memory_limit: int | None = None  # bytes; None = the pool's whole virtual capacity
    gpu_utilization: float = 0.95  # keep (1 - x) of the device as headroom

    def __post_init__(self) -> None:
        if self.page_size <= 0 or self.page_size % MiB:
            raise ConfigError(f"page_size={self.page_size}", "must be a positive multiple of 1 MiB",
                              "use 2 MiB (the default) or a multiple of the device granularity")
        if not 0 <= self.min_reserved_pages <= self.max_reserved_pages:
            raise ConfigError(
                f"min_reserved_pages={self.min_reserved_pages}, "
                f"max_reserved_pages={self.max_reserved_pages}",
                "need 0 <= min <= max", "raise max_reserved_pages or lower min_reserved_pages")
        if not 0.0 < self.gpu_utilization <= 1.0:
            raise ConfigError(f"gpu_utilization={self.gpu_utilization}", "must be in (0, 1]",
                              "use e.g. 0.95 to keep 5% of the device free")
        if self.max_cached_tokens < -1:
            raise ConfigError(f"max_cached_tokens={self.max_cached_tokens}",
                              "-1 means unlimited, 0 evict at once, N a bound",
                              "use -1, 0 or a positive number")
        if self.ipc_name is not None:
            check_ipc_name(self.ipc_name)
        if self.memory_limit is not None and self.memory_limit < 0:
            raise ConfigError(f"memory_limit={self.memory_limit}", "is negative",
                              "use a size of 0 or more, or leave it unset")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> PoolConfig:
        """Read ``WORKBENCH_KV_<FIELD>`` variables, e.g. ``WORKBENCH_KV_PAGE_SIZE=4MiB``."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None:
                continue
            values[f.name] = _coerce(f.name, f.type, raw)
        return replace(cls(**values), **overrides) if overrides else cls(**values)


def _coerce(name: str, typ: object, raw: str):
    var = ENV_PREFIX + name.upper()
    t = str(typ)
    try:
        if "bool" in t:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if name in ("page_size", "memory_limit"):
            return parse_size(raw)
        if "float" in t:
            return float(raw)
        if "int" in t:
            return int(raw)
        return raw
    except (ValueError, ConfigError) as err:
        raise ConfigError(f"{var}={raw!r}", f"cannot be read as {t}",
                          f"fix or unset {var}") from err
