"""Pool configuration: KVCacheD's knobs as one typed object, readable from ``WORKBENCH_KV_*``.

Each field is a knob of :mod:`workbench.knobs` (its type, range, default and refusal live there),
so ``PoolConfig(page_size=3 * MiB)`` is refused with the same words as
``WORKBENCH_KV_PAGE_SIZE=3MiB`` or a trace's ``"page_size": 3145728``. Our own prefix means an
installed kvcached (``KVCACHED_*``) is never affected, nor affects us.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from workbench.knobs import POOL_KNOBS, check, check_reserve, default
from workbench.names import check_name

__all__ = ["PoolConfig", "check_ipc_name"]


def check_ipc_name(name: str) -> str:
    """IPC names become file names under /dev/shm: checked in one place (workbench.names)."""
    return check_name(name)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    page_size: int = default("page_size")
    contiguous_layout: bool = default("contiguous_layout")
    prealloc: bool = default("prealloc")
    min_reserved_pages: int = default("min_reserved_pages")
    max_reserved_pages: int = default("max_reserved_pages")
    max_cached_tokens: int = default("max_cached_tokens")  # -1 unlimited, 0 evict at once
    ipc_name: str | None = default("ipc_name")
    memory_limit: int | None = default("memory_limit")  # bytes; None = the whole capacity
    gpu_utilization: float = default("gpu_utilization")  # keep (1 - x) of the device free

    def __post_init__(self) -> None:
        for knob in POOL_KNOBS:  # normalised: "4MiB" -> 4194304, a numpy int -> int
            object.__setattr__(self, knob.name, check(knob.name, getattr(self, knob.name)))
        check_reserve(self.min_reserved_pages, self.max_reserved_pages,
                      f"min_reserved_pages={self.min_reserved_pages} with "
                      f"max_reserved_pages={self.max_reserved_pages}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> PoolConfig:
        """The pool knobs of ``WORKBENCH_KV_<FIELD>`` (see :class:`Settings`), e.g.
        ``WORKBENCH_KV_PAGE_SIZE=4MiB``; ``overrides`` win over the environment."""
        from workbench.settings import settings

        s = settings(env)
        values = {f.name: getattr(s, f.name) for f in fields(cls) if f.name in s.given}
        values.update(overrides)
        return cls(**values)
