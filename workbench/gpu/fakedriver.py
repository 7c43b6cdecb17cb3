"""A stand-in for ``cuda.bindings.driver`` that answers at once, for measuring on a CPU host.

It has the call signatures :class:`~workbench.gpu.device.CudaDevice`, the zero page and the
bench's raw baseline use (every call returns ``(CUresult, *values)``, 0 for success), and keeps
just enough state to answer like a driver: reservations, allocations against a capacity,
mappings (a map must cover a whole allocation, a map onto a mapped start is refused), so the
workbench's path through it is the real one. What it cannot tell is how long the GPU takes:
timing the workbench and the raw calls over it measures the *Python* each one adds, the
overhead budget of ``workbench bench vmm`` (see :func:`workbench.bench.overhead.run_overhead`).

Install it with :func:`workbench.gpu.driver.use_driver` (``with use_driver(FakeDriver()): ...``).
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

from workbench.units import GiB, MiB

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, NOT_SUPPORTED = 0, 1, 2, 801
_NAMES = {INVALID_VALUE: b"CUDA_ERROR_INVALID_VALUE", OUT_OF_MEMORY: b"CUDA_ERROR_OUT_OF_MEMORY",
          NOT_SUPPORTED: b"CUDA_ERROR_NOT_SUPPORTED"}
_OK = (SUCCESS,)


class _Location:
    __slots__ = ("id", "type")

    def __init__(self) -> None:
        self.type = 0
        self.id = 0


class CUmemAllocationProp:
    __slots__ = ("location", "type")

    def __init__(self) -> None:
        self.type = 0
        self.location = _Location()


class CUmemAccessDesc:
    __slots__ = ("flags", "location")

    def __init__(self) -> None:
        self.location = _Location()
        self.flags = 0


class FakeDriver:
    """One fake GPU of ``capacity`` bytes with a ``granularity``; see the module docstring."""

    CUmemAllocationProp = CUmemAllocationProp
    CUmemAccessDesc = CUmemAccessDesc
    CUdevice_attribute = SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED=102)
    CUmemAllocationType = SimpleNamespace(CU_MEM_ALLOCATION_TYPE_PINNED=1)
    CUmemLocationType = SimpleNamespace(CU_MEM_LOCATION_TYPE_DEVICE=1)
    CUmemAllocationGranularity_flags = SimpleNamespace(CU_MEM_ALLOC_GRANULARITY_MINIMUM=0)
    CUmemAccess_flags = SimpleNamespace(CU_MEM_ACCESS_FLAGS_PROT_READ=1,
                                        CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)

    def __init__(self, capacity: int = 141 * GiB, granularity: int = 2 * MiB):
        self.capacity, self.granularity = capacity, granularity
        self.used = 0
        self.allocs: dict[int, int] = {}  # handle -> size
        self.maps: dict[int, int] = {}  # va -> size
        self.reserved: dict[int, int] = {}  # va -> size
        self._next_va = 1 << 44
        self._next_handle = 1
        self.calls = 0  # VMM calls made (create/map/set-access/unmap/release)
        self.info_calls = 0  # cuMemGetInfo calls

    # -- setup -------------------------------------------------------------------------------
    def cuInit(self, flags):
        return _OK

    def cuDeviceGet(self, index):
        return SUCCESS, index

    def cuDeviceGetAttribute(self, attr, dev):
        return SUCCESS, 1

    def cuDevicePrimaryCtxRetain(self, dev):
        return SUCCESS, 1

    def cuCtxSetCurrent(self, ctx):
        return _OK

    def cuDeviceGetName(self, n, dev):
        return SUCCESS, b"Fake GPU (instant driver)\0"

    def cuMemGetAllocationGranularity(self, prop, flags):
        return SUCCESS, self.granularity

    def cuGetErrorName(self, err):
        return SUCCESS, _NAMES.get(err, b"CUDA_ERROR_UNKNOWN")

    def cuCtxSynchronize(self):
        return _OK

    def cuMemsetD8(self, va, value, n):
        return _OK

    def cuMemcpyDtoH(self, ptr, va, n):
        ctypes.memset(ptr, 0, n)  # unbacked or fresh memory reads as zeros here
        return _OK

    def cuMemGetInfo(self):
        self.info_calls += 1
        return SUCCESS, self.capacity - self.used, self.capacity

    # -- virtual memory ----------------------------------------------------------------------
    def cuMemAddressReserve(self, size, align, addr, flags):
        va = self._next_va
        self._next_va += size + self.granularity
        self.reserved[va] = size
        return SUCCESS, va

    def cuMemAddressFree(self, va, size):
        return _OK if self.reserved.pop(va, None) == size else (INVALID_VALUE,)

    def cuMemCreate(self, size, prop, flags):
        self.calls += 1
        if self.used + size > self.capacity:
            return OUT_OF_MEMORY, None
        h = self._next_handle
        self._next_handle += 1
        self.allocs[h] = size
        self.used += size
        return SUCCESS, h

    def cuMemMap(self, va, size, offset, handle, flags):
        self.calls += 1
        if self.allocs.get(handle) != size or offset:
            return (NOT_SUPPORTED,)  # only whole allocations map
        if va in self.maps:
            return (INVALID_VALUE,)
        self.maps[va] = size
        return _OK

    def cuMemSetAccess(self, va, size, desc, count):
        self.calls += 1
        return _OK

    def cuMemUnmap(self, va, size):
        """One mapping, or a run of adjacent ones that ``[va, va+size)`` covers exactly."""
        self.calls += 1
        maps = self.maps
        n = maps.get(va)
        if n == size:
            del maps[va]
            return _OK
        pos, run = va, []
        while pos < va + size and pos in maps:
            run.append(pos)
            pos += maps[pos]
        if pos != va + size:
            return (INVALID_VALUE,)
        for p in run:
            del maps[p]
        return _OK

    def cuMemRelease(self, handle):
        self.calls += 1
        size = self.allocs.pop(handle, None)
        if size is None:
            return (INVALID_VALUE,)
        self.used -= size
        return _OK
