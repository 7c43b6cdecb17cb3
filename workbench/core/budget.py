"""A memory budget several pools share on one device (a lesson's GPU inside a real GPU).

On the simulated and host backends a device's capacity is a constructor argument; a real GPU has
the memory it has. A lesson about contention (chapter 04: three pools oversubscribing one device)
would show none on a 141 GiB GPU, so :class:`BudgetDevice` wraps any device and refuses a
``create`` that would take the bytes created through it past ``budget``, the way the driver refuses
one past the device's memory (``out of memory``). Every other call goes to the device unchanged:
the mappings, and their cost, are the real ones.
"""

from __future__ import annotations

from typing import Any

from workbench.core.device import Device, MemInfo
from workbench.errors import ConfigError, DeviceError


class BudgetDevice:
    """``inner`` with at most ``budget`` bytes of physical memory created through it."""

    def __init__(self, inner: Device, budget: int):
        if budget <= 0 or budget % inner.granularity:
            raise ConfigError(f"budget {budget}", "it must be a positive multiple of the "
                              f"device's granularity ({inner.granularity} bytes)",
                              "round the budget to whole pages")
        self.inner, self.budget = inner, budget
        self.name = f"{inner.name} (budget {budget / 2**30:.2f} GiB)"
        self.granularity = inner.granularity
        self._sizes: dict[int, int] = {}
        self.created = 0  # bytes created through this wrapper and not yet released

    def create(self, size: int) -> int:
        if self.created + size > self.budget:
            raise DeviceError("create", f"out of memory (the {self.budget / 2**30:.2f} GiB budget "
                              "the pools share is used up)", "CUDA_ERROR_OUT_OF_MEMORY")
        handle = self.inner.create(size)
        self._sizes[handle] = size
        self.created += size
        return handle

    def release(self, handle: int) -> None:
        self.inner.release(handle)
        self.created -= self._sizes.pop(handle, 0)

    def mem_info(self) -> MemInfo:
        free = min(self.inner.mem_info().free, self.budget - self.created)
        return MemInfo(free, self.budget)

    def reserve(self, size: int) -> int:
        return self.inner.reserve(size)

    def unreserve(self, va: int, size: int) -> None:
        self.inner.unreserve(va, size)

    def map(self, va: int, size: int, handle: int) -> None:
        self.inner.map(va, size, handle)

    def set_access(self, va: int, size: int) -> None:
        self.inner.set_access(va, size)

    def unmap(self, va: int, size: int) -> None:
        self.inner.unmap(va, size)

    def now(self) -> float:
        return self.inner.now()

    @property
    def busy_s(self) -> float:
        return self.inner.busy_s

    def __getattr__(self, attr: str) -> Any:
        # facts about the device (its zero page, queued work, a synchronize) pass through; the
        # batched fast paths do not, since they are looked up on the class (KVSpace)
        return getattr(self.inner, attr)
