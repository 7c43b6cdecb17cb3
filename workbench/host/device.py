"""Host memory as a device: Linux virtual memory behind the same calls as a GPU's VMM API.

====================  ===================================================================
call                  Linux
====================  ===================================================================
``reserve(size)``     ``mmap(NULL, size, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)``:
                      reads see the zero page, writes fault, nothing is resident
``create(size)``      ``memfd_create`` + ``ftruncate`` + ``fallocate``: the pages exist now,
                      so running out of memory fails here, not later as a SIGBUS
``map(va, n, h)``     ``mmap(va, n, PROT_READ, MAP_SHARED|MAP_FIXED|MAP_POPULATE, fd)``
``set_access(va, n)`` ``mprotect(va, n, PROT_READ|PROT_WRITE)``
``unmap(va, n)``      ``mmap(va, n, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED)``: the zero
                      page is back in one call, so the range is never a hole another mmap takes
``release(h)``        ``fallocate(PUNCH_HOLE)`` + ``close``: the memory goes back at once
``unreserve``         ``munmap``
====================  ===================================================================

The memfd pages count as shared memory (``Shmem`` in /proc/meminfo) from ``create`` to ``release``,
and in this process's ``RssShmem`` while mapped. ``tensor``/``ndarray`` give zero-copy views.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap as _mmap
import os
import time
from typing import Any

from workbench.core.device import DriverRefusals, MemInfo
from workbench.errors import ConfigError, DeviceError
from workbench.units import MiB, align_up

PROT_NONE, PROT_READ, PROT_WRITE = 0x0, 0x1, 0x2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MAP_NORESERVE, MAP_POPULATE = 0x4000, 0x8000
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
MAP_FAILED = ctypes.c_void_p(-1).value

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        _libc = lib
    return _libc


def _errno(op: str, what: str) -> DeviceError:
    e = ctypes.get_errno()
    return DeviceError(op, f"{what}: {os.strerror(e)}", e)


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, rest = line.split(":", 1)
            parts = rest.split()
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


def rss_shmem(pid: int | str = "self") -> int:
    """Bytes of shared memory (memfd pages) resident in a process: ``RssShmem``."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    return 0


class HostDevice(DriverRefusals):
    """This host's memory behind the :class:`~workbench.core.device.Device` calls.

    ``capacity`` caps what ``create`` may commit (like a GPU's size); without it the device is the
    machine, and ``mem_info`` reads ``MemAvailable``. ``granularity`` defaults to 2 MiB so pages
    and maps have the same shape as on a GPU; any multiple of the OS page size works.
    """

    torch_device = "cpu"  # tensor views over this memory are CPU tensors

    def __init__(self, *, capacity: int | None = None, granularity: int = 2 * MiB,
                 name: str = "host", populate: bool = True):
        if granularity <= 0 or granularity % _mmap.PAGESIZE:
            raise ConfigError(f"granularity={granularity}",
                              f"must be a positive multiple of the OS page ({_mmap.PAGESIZE} B)",
                              "use 2 MiB (default) or a multiple of 4 KiB")
        if capacity is not None and capacity <= 0:
            raise ConfigError(f"capacity={capacity}", "must be positive", "leave it unset "
                              "to use the machine's memory")
        self.name = name
        self.granularity = granularity
        self.capacity = capacity
        self.populate = populate  # prefault on map: residency tracks map/unmap exactly
        self._busy = 0.0
        self._next_handle = 1
        self._init_tables()  # reservations: va -> size; mappings: va -> (size, handle)
        self.allocations: dict[int, tuple[int, int]] = {}  # handle -> (fd, size)
        self.writable: set[int] = set()

    # -- time --------------------------------------------------------------------------------
    @property
    def busy_s(self) -> float:
        return self._busy

    def now(self) -> float:
        return time.monotonic()

    def _timed(self, t0: float) -> None:
        self._busy += time.perf_counter() - t0

    # -- helpers -----------------------------------------------------------------------------
    @property
    def allocated_bytes(self) -> int:
        return sum(n for _, n in self.allocations.values())

    # -- Device ------------------------------------------------------------------------------
    def mem_info(self) -> MemInfo:
        if self.capacity is not None:
            return MemInfo(self.capacity - self.allocated_bytes, self.capacity)
        m = meminfo()
        return MemInfo(m.get("MemAvailable", m["MemFree"]), m["MemTotal"])

    def reserve(self, size: int) -> int:
        self._refuse_size("reserve", size)
        t0 = time.perf_counter()
        # Over-reserve by one granule so the start can be aligned like a GPU reservation.
        raw = libc().mmap(None, size + self.granularity, PROT_READ,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if raw in (None, MAP_FAILED):
            raise _errno("reserve", f"mmap of {size} bytes")
        va = align_up(raw, self.granularity)
        head, tail = va - raw, raw + self.granularity - va
        if head:
            libc().munmap(raw, head)
        if tail:
            libc().munmap(va + size, tail)
        self.reservations[va] = size
        self._timed(t0)
        return va

    def unreserve(self, va: int, size: int) -> None:
        self._refuse_unreserve(va, size)
        if libc().munmap(va, size) != 0:
            raise _errno("unreserve", f"munmap {va:#x}+{size}")
        del self.reservations[va]

    def create(self, size: int) -> int:
        self._refuse_size("create", size)
        if size > self.mem_info().free:
            raise DeviceError("create", "out of memory", "ENOMEM")
        t0 = time.perf_counter()
        fd = os.memfd_create(f"workbench-kv-{self._next_handle}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            if libc().fallocate(fd, 0, 0, size) != 0:  # commit now: OOM here, not SIGBUS later
                raise _errno("create", f"fallocate {size} bytes")
        except BaseException:
            os.close(fd)
            raise
        h = self._next_handle
        self._next_handle += 1
        self.allocations[h] = (fd, size)
        self._timed(t0)
        return h

    def map(self, va: int, size: int, handle: int) -> None:
        fd, hsize = self.allocations.get(handle, (-1, None))
        self._refuse_map(va, size, handle, hsize)
        t0 = time.perf_counter()
        flags = MAP_SHARED | MAP_FIXED | (MAP_POPULATE if self.populate else 0)
        got = libc().mmap(va, size, PROT_READ, flags, fd, 0)
        if got != va:
            raise _errno("map", f"mmap fixed {va:#x}+{size}")
        self.mappings[va] = (size, handle)
        self._timed(t0)

    def set_access(self, va: int, size: int) -> None:
        self._refuse_unmapped("set_access", va, size)
        t0 = time.perf_counter()
        if libc().mprotect(va, size, PROT_READ | PROT_WRITE) != 0:
            raise _errno("set_access", f"mprotect {va:#x}+{size}")
        self.writable.add(va)
        self._timed(t0)

    def unmap(self, va: int, size: int) -> None:
        self._refuse_unmapped("unmap", va, size)
        t0 = time.perf_counter()
        got = libc().mmap(va, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED
                          | MAP_NORESERVE, -1, 0)
        if got != va:
            raise _errno("unmap", f"remap zero page at {va:#x}+{size}")
        del self.mappings[va]
        self.writable.discard(va)
        self._timed(t0)

    def release(self, handle: int) -> None:
        self._refuse_release(handle, handle in self.allocations)
        t0 = time.perf_counter()
        fd, size = self.allocations.pop(handle)
        # Punch first: the memory returns now even if someone still holds a dup of the fd.
        libc().fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, size)
        os.close(fd)
        self._timed(t0)

    def close(self) -> None:
        """Drop every mapping, allocation and reservation (tests, shutdown)."""
        for va, (size, _) in list(self.mappings.items()):
            self.unmap(va, size)
        for h in list(self.allocations):
            self.release(h)
        for va, size in list(self.reservations.items()):
            self.unreserve(va, size)

    # -- views -------------------------------------------------------------------------------
    def buffer(self, va: int, nbytes: int) -> ctypes.Array:
        """A ctypes byte array over ``[va, va+nbytes)`` (inside one reservation)."""
        if not self._inside(va, nbytes):
            raise DeviceError("view", f"{va:#x}+{nbytes} is outside every reservation")
        return (ctypes.c_uint8 * nbytes).from_address(va)

    def ndarray(self, va: int, nbytes: int, dtype: Any = "uint8"):
        import numpy as np

        return np.frombuffer(self.buffer(va, nbytes), dtype=dtype)

    def tensor(self, va: int, nbytes: int, dtype: Any = None):
        """A flat torch CPU tensor over ``[va, va+nbytes)``; no copy, no ownership."""
        import torch

        dtype = dtype or torch.uint8
        return torch.frombuffer(self.buffer(va, nbytes), dtype=dtype)
