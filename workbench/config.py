"""Pool configuration: KVCacheD's knobs as one typed object, readable from ``WORKBENCH_KV_*``.

Our own prefix means an installed kvcached (``KVCACHED_*``) is never affected, nor affects us.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from workbench.errors import ConfigError
from workbench.names import check_name

ENV_PREFIX = "WORKBENCH_KV_"
MiB = 1 << 20

_SIZE = re.compile(r"^\s*(-?\d{1,40})(?:\.(\d{1,9}))?\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
MAX_SIZE = (1 << 62) - 1  # control segments store sizes as int64: leave headroom for sums


def parse_size(text: str | int) -> int:
    """``8G``, ``512MiB``, ``1.5g``, ``4096`` → bytes (binary units). Raises ConfigError.

    Exact integer arithmetic (no float), so a huge number is refused as too large rather than
    overflowing; a bool is not a size."""
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise ConfigError(f"size {text!r}", "not a size",
                          "write a number with an optional unit: 4096, 512MiB, 8G")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(text)
        if not m:
            raise ConfigError(f"size {text!r}", "not a size",
                              "write a number with an optional unit: 4096, 512MiB, 8G")
        whole, frac, unit = m.group(1), m.group(2) or "", _UNITS[m.group(3).lower()]
        value = int(whole + frac) * unit
        value = -(-value // 10 ** len(frac)) if value < 0 else value // 10 ** len(frac)
    if value < 0:
        raise ConfigError(f"size {text!r}", "is negative", "use a size of 0 or more")
    if value > MAX_SIZE:
        raise ConfigError(f"size {text!r}", f"is larger than {MAX_SIZE} bytes",
                          "use a size below 4 EiB")
    return value


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def check_ipc_name(name: str) -> str:
    """IPC names become file names under /dev/shm: checked in one place (workbench.names)."""
    return check_name(name)


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
        """The pool knobs of ``WORKBENCH_KV_<FIELD>`` (see :class:`Settings`), e.g.
        ``WORKBENCH_KV_PAGE_SIZE=4MiB``; ``overrides`` win over the environment."""
        from workbench.settings import settings

        s = settings(env)
        values = {f.name: getattr(s, f.name) for f in fields(cls) if f.name in s.model_fields_set}
        values.update(overrides)
        return cls(**values)
