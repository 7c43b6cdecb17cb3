""":class:`~workbench.gpu.fakedriver.FakeDriver` whose five VMM calls are a C library's
(``fakecuda.c``): the driver both of :class:`~workbench.gpu.device.CudaDevice`'s paths call, the
Python batch through ctypes here and the C fast path directly (``C_LIBRARY`` names it to
:func:`~workbench.gpu.fastcalls.for_driver`). So a CPU can run the real C fast path and compare
it call for call with the Python one: the library logs every call and fails the k-th on demand.

The library keeps one state per process and path: a new CFakeDriver resets it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from workbench.gpu.fakedriver import FakeDriver
from workbench.units import GiB, MiB

LIBRARY = Path(__file__).with_name("_fakecuda.so")
OPS = {1: "create", 2: "map", 3: "set_access", 4: "unmap", 5: "release"}
_u64, _vp = ctypes.c_uint64, ctypes.c_void_p


class _Location(ctypes.Structure):
    _fields_ = (("type", ctypes.c_int), ("id", ctypes.c_int))


class CUmemAllocationProp(ctypes.Structure):
    """The driver struct's layout (the fields the fake reads come first)."""

    _fields_ = (("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", _Location), ("win32HandleMetaData", _vp),
                ("allocFlags", ctypes.c_ubyte * 8))


class CUmemAccessDesc(ctypes.Structure):
    _fields_ = (("location", _Location), ("flags", ctypes.c_int))


class CFakeDriver(FakeDriver):
    """A FakeDriver over the C library at ``library`` (built by ``make vmmfast``)."""

    CUmemAllocationProp = CUmemAllocationProp
    CUmemAccessDesc = CUmemAccessDesc

    def __init__(self, library: Path | str = LIBRARY, capacity: int = 141 * GiB,
                 granularity: int = 2 * MiB):
        super().__init__(capacity, granularity)
        self.C_LIBRARY = os.fspath(library)
        lib = self.lib = ctypes.CDLL(self.C_LIBRARY)
        for name, args, res in (
                ("cuMemCreate", (ctypes.POINTER(_u64), ctypes.c_size_t, _vp, _u64), ctypes.c_int),
                ("cuMemMap", (_u64, ctypes.c_size_t, ctypes.c_size_t, _u64, _u64), ctypes.c_int),
                ("cuMemSetAccess", (_u64, ctypes.c_size_t, _vp, ctypes.c_size_t), ctypes.c_int),
                ("cuMemUnmap", (_u64, ctypes.c_size_t), ctypes.c_int),
                ("cuMemRelease", (_u64,), ctypes.c_int),
                ("fake_reset", (_u64,), None), ("fake_fail", (_u64, ctypes.c_int), None),
                ("fake_calls", (), _u64), ("fake_used", (), _u64),
                ("fake_log", (ctypes.POINTER(_u64), _u64), _u64)):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        self._h = _u64()
        self._create, self._map, self._access = lib.cuMemCreate, lib.cuMemMap, lib.cuMemSetAccess
        self._unmap, self._release = lib.cuMemUnmap, lib.cuMemRelease
        lib.fake_reset(capacity)

    # -- the five calls, cuda.bindings-shaped ------------------------------------------------
    def cuMemCreate(self, size, prop, flags):
        err = self._create(ctypes.byref(self._h), size, ctypes.addressof(prop), flags)
        return (err, None) if err else (err, self._h.value)

    def cuMemMap(self, va, size, offset, handle, flags):
        return (self._map(va, size, offset, int(handle), flags),)

    def cuMemSetAccess(self, va, size, desc, count):
        return (self._access(va, size, ctypes.addressof(desc[0]), count),)

    def cuMemUnmap(self, va, size):
        return (self._unmap(va, size),)

    def cuMemRelease(self, handle):
        return (self._release(int(handle)),)

    def cuMemGetInfo(self):
        self.info_calls += 1
        return 0, self.capacity - self.lib.fake_used(), self.capacity

    # -- the test side -----------------------------------------------------------------------
    def fail(self, k: int, code: int = 2) -> None:
        """Make the ``k``-th VMM call from now fail with ``code`` (0: none)."""
        self.lib.fake_fail(k, code)

    @property
    def vmm_calls(self) -> int:
        return self.lib.fake_calls()

    def log(self) -> list[tuple[str, int, int, int, int, bool]]:
        """Every call so far: (op, va, size, handle or count, info, failed on purpose)."""
        n = self.lib.fake_log(None, 0)
        buf = (_u64 * (5 * n))()
        self.lib.fake_log(buf, n)
        w = list(buf)
        return [(OPS[w[i] & 0xFF], w[i + 1], w[i + 2], w[i + 3], w[i + 4], bool(w[i] >> 8))
                for i in range(0, 5 * n, 5)]
