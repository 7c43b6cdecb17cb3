"""A real GPU behind the device interface: CUDA virtual memory through ``cuda.bindings.driver``.

The refusals are the ones the simulated and host devices make, from the one copy in
:class:`~workbench.core.device.DriverRefusals` (map onto any mapped byte, unmap of nothing, release
of a mapped or unknown handle all raise DeviceError before the driver is touched), so the core
behaves identically on every backend; every driver status becomes a DeviceError and nothing
aborts.

Unbacked ranges show the shared zero page (:mod:`workbench.gpu.zeropage`), mapped read-only where
the driver allows it (``zero_access``), so reading an unbacked block gives zeros and writing one
faults loudly instead of aliasing every other unbacked block (kvcached's zero page is writable).
``zero_page=False`` leaves unbacked ranges unmapped (reads fault); ``zero_writable=True`` maps the
zero page read-write (the engine adapters: a warm-up or padded write to a not-yet-backed slot
lands on the shared zero page instead of faulting; reads of unbacked slots are then undefined).

The hot calls (create/map/set_access/unmap/release) are written out flat: a page id in the
PER_LAYER layout of a 32-layer model is 192 of them, so each microsecond here shows in the bench.
"""

from __future__ import annotations

import ctypes
import threading
from functools import partial
from time import perf_counter
from typing import Any

from workbench.core.device import DriverRefusals, MemInfo
from workbench.errors import DeviceError
from workbench.gpu.batch import BatchCalls
from workbench.gpu.driver import call, driver, fail
from workbench.gpu.fastcalls import FastCalls, for_driver
from workbench.gpu.zeropage import ZeroPage
from workbench.units import MiB, ceil_div

_mem_info = partial(tuple.__new__, MemInfo)


class CudaDevice(BatchCalls, DriverRefusals):
    """One CUDA device's physical memory as seen by this process (its primary context).

    ``mem_info_ttl_s``: cuMemGetInfo costs ~7 µs and the core asks before every map, so a reading
    is reused this long, corrected at once for what this object creates and releases (other
    processes' changes show within the TTL). ``zero_max_exact``: the largest zero piece (and
    zero handle) the zero page makes; see :mod:`workbench.gpu.zeropage`. ``fast_path``: issue a
    page id's batch from C where :func:`~workbench.gpu.fastcalls.for_driver` finds the library
    (True), never (False, the Python batch), or through the given ``FastCalls`` (tests);
    ``fast_path_note`` says which and why.
    """

    queued_work = True  # kernels queued on CUDA streams may still read a page being freed

    @property
    def torch_device(self) -> str:
        """The torch device tensor views over this memory live on."""
        return f"cuda:{self.index}"

    def __init__(self, device_index: int = 0, *, zero_page: bool = True,
                 zero_max_exact: int = 256 * MiB, mem_info_ttl_s: float = 0.005,
                 name: str | None = None, zero_writable: bool = False,
                 fast_path: bool | FastCalls = True):
        cu = self._cu = driver()
        call("cuInit", cu.cuInit, 0)
        self.index = device_index
        self._dev = call("cuDeviceGet", cu.cuDeviceGet, device_index)
        attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        if not call("cuDeviceGetAttribute", cu.cuDeviceGetAttribute, attr, self._dev):
            raise DeviceError("init", f"device {device_index} does not support CUDA virtual "
                                      "memory management")
        self._ctx = call("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain, self._dev)
        self._bound: set[int] = set()
        self._bind()
        raw = call("cuDeviceGetName", cu.cuDeviceGetName, 256, self._dev)
        label = raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw)
        self.name = name or f"cuda:{device_index} ({label})"

        self._prop = cu.CUmemAllocationProp()
        self._prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        self._prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self._prop.location.id = device_index
        self.granularity = int(call(
            "cuMemGetAllocationGranularity", cu.cuMemGetAllocationGranularity, self._prop,
            cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
        self._rw = [self._access(cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)]
        self._ro = [self._access(cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ)]
        self.zero: ZeroPage | None = (
            ZeroPage(cu, self._prop, self.granularity, self._rw, self._ro, zero_max_exact,
                     writable=zero_writable) if zero_page else None)

        self._busy = 0.0
        self._init_tables()  # reservations: va -> size; mappings: va -> (size, handle id)
        self._last_reservation = (0, 0)  # [start, end) the batch last mapped in (a cache)
        self._alloc: dict[int, tuple[Any, int]] = {}  # handle id -> (driver handle, size)
        self.occupied: dict[str, list[int]] = {}  # owner -> handles held outside any pool
        self.mem_info_ttl_s = mem_info_ttl_s
        self._info: tuple[float, int, int] | None = None  # (time, free, total)
        self._delta = 0  # bytes created minus released since that reading
        self._zero_seen = 0  # zero-page bytes at that reading
        self._prepare_hot()
        if fast_path is True:
            self._fast, self.fast_path_note = for_driver(cu)
        else:
            self._fast = fast_path or None
            self.fast_path_note = "on (given)" if self._fast else "off: fast_path=False"
        if self._fast is not None:
            self._fast.bind(self._prop, self._rw, self._ro)

    def _access(self, flags: Any) -> Any:
        cu = self._cu
        d = cu.CUmemAccessDesc()
        d.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        d.location.id = self.index
        d.flags = flags
        return d

    def _bind(self) -> None:
        """Make the primary context current on the calling thread (once per thread)."""
        tid = threading.get_ident()
        if tid not in self._bound:
            call("cuCtxSetCurrent", self._cu.cuCtxSetCurrent, self._ctx)
            self._bound.add(tid)

    @property
    def zero_page(self) -> bool:
        return self.zero is not None

    @property
    def zero_access(self) -> str | None:
        return self.zero.access if self.zero is not None else None

    # -- time --------------------------------------------------------------------------------
    @property
    def busy_s(self) -> float:
        return self._busy

    now = staticmethod(perf_counter)  # the device's clock (the builtin itself: one call less)

    @property
    def held_bytes(self) -> int:
        """Physical bytes this object holds now: live allocations plus zero pieces."""
        zero = self.zero.held_bytes if self.zero is not None else 0
        return sum(size for _, size in self._alloc.values()) + zero

    # -- Device ------------------------------------------------------------------------------
    @property
    def budget_identity(self) -> str | None:
        """The GPU's UUID (``GPU-8-4-4-4-12`` hex, as nvidia-smi prints it): its shared budget's
        name, the same in every process whatever ``CUDA_VISIBLE_DEVICES`` says; None when the
        driver cannot tell (a fake driver), and the budget is named after ``cuda:N``."""
        get = getattr(self._cu, "cuDeviceGetUuid_v2", None) or \
            getattr(self._cu, "cuDeviceGetUuid", None)
        try:
            err, uuid = get(self._dev)
            raw = bytes(uuid.bytes)[:16] if int(err) == 0 else b""
        except Exception:  # no such call, or an older binding's other shape: fall back
            return None
        if len(raw) != 16:
            return None
        h = raw.hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def mem_info(self) -> MemInfo:
        t0 = perf_counter()
        info = self._info
        if info is None or t0 - info[0] >= self.mem_info_ttl_s:
            self._bind()
            free, total = call("cuMemGetInfo", self._cu.cuMemGetInfo)
            info = self._info = (t0, int(free), int(total))
            self._delta = 0
            self._zero_seen = self.zero.held_bytes if self.zero is not None else 0
            self._busy += perf_counter() - t0  # a cached reading costs no driver time
        free = info[1] - self._delta
        if self.zero is not None:
            free -= self.zero.held_bytes - self._zero_seen
        # the core asks before every new page: build the NamedTuple without its Python __new__
        return _mem_info((free if free > 0 else 0, info[2]))

    def reserve(self, size: int) -> int:
        t0 = perf_counter()
        try:
            self._refuse_size("reserve", size)
            self._bind()
            cu = self._cu
            va = int(call("reserve", cu.cuMemAddressReserve, size, self.granularity, 0, 0))
            if self.zero is not None:
                try:
                    self.zero.fill(va, size, exact=False)
                except DeviceError:
                    cu.cuMemAddressFree(va, size)
                    raise
            self.reservations[va] = size
            return va
        finally:
            self._busy += perf_counter() - t0

    def unreserve(self, va: int, size: int) -> None:
        t0 = perf_counter()
        try:
            self._refuse_unreserve(va, size)
            self._bind()
            if self.zero is not None:
                self.zero.release_range(va, size)
            call("unreserve", self._cu.cuMemAddressFree, va, size)
            del self.reservations[va]
            self._last_reservation = (0, 0)
        finally:
            self._busy += perf_counter() - t0

    def create(self, size: int) -> int:
        t0 = perf_counter()
        self._refuse_size("create", size)
        if threading.get_ident() not in self._bound:
            self._bind()
        err, h = self._cu.cuMemCreate(size, self._prop, 0)
        if err:
            self._busy += perf_counter() - t0
            raise fail("create", err)
        hid = int(h)
        self._alloc[hid] = (h, size)
        self._delta += size
        self._busy += perf_counter() - t0
        return hid

    def map(self, va: int, size: int, handle: int) -> None:
        t0 = perf_counter()
        entry = self._alloc.get(handle)
        self._refuse_map(va, size, handle, entry[1] if entry is not None else None)
        if threading.get_ident() not in self._bound:
            self._bind()
        zero = self.zero
        try:
            if zero is not None:
                zero.clear(va, size)
            err = self._cu.cuMemMap(va, size, 0, entry[0], 0)[0]
            if err:
                if zero is not None:
                    self._rezero(va, size)
                raise fail("map", err)
        finally:
            self._busy += perf_counter() - t0
        self.mappings[va] = (size, handle)

    def set_access(self, va: int, size: int) -> None:
        t0 = perf_counter()
        self._refuse_unmapped("set_access", va, size)
        if threading.get_ident() not in self._bound:
            self._bind()
        err = self._cu.cuMemSetAccess(va, size, self._rw, 1)[0]
        self._busy += perf_counter() - t0
        if err:
            raise fail("set_access", err)

    def unmap(self, va: int, size: int) -> None:
        t0 = perf_counter()
        self._refuse_unmapped("unmap", va, size)
        if threading.get_ident() not in self._bound:
            self._bind()
        err = self._cu.cuMemUnmap(va, size)[0]
        if err:
            self._busy += perf_counter() - t0
            raise fail("unmap", err)
        del self.mappings[va]
        if self.zero is not None:
            self._rezero(va, size)
        self._busy += perf_counter() - t0

    def _rezero(self, va: int, size: int) -> None:
        """Put the zero page back; a failure leaves a hole (reads fault) but loses nothing."""
        try:
            self.zero.fill(va, size)  # type: ignore[union-attr]
        except DeviceError:
            pass

    def release(self, handle: int) -> None:
        t0 = perf_counter()
        entry = self._alloc.get(handle)
        self._refuse_release(handle, entry is not None)
        if threading.get_ident() not in self._bound:
            self._bind()
        err = self._cu.cuMemRelease(entry[0])[0]
        if err:
            self._busy += perf_counter() - t0
            raise fail("release", err)
        del self._alloc[handle]
        self._delta -= entry[1]
        self._busy += perf_counter() - t0

    # -- extras (tests, benchmarks, labs) ----------------------------------------------------
    def occupy(self, owner: str, nbytes: int) -> None:
        """Hold ``nbytes`` (rounded up to the granularity) for ``owner`` outside every pool."""
        for hid in self.occupied.pop(owner, []):
            self.release(hid)
        g = self.granularity
        held: list[int] = []
        try:
            for _ in range(ceil_div(nbytes, g)):
                held.append(self.create(g))
        except DeviceError:
            for hid in held:
                self.release(hid)
            raise
        self.occupied[owner] = held

    def read(self, va: int, nbytes: int) -> bytes:
        """Copy ``nbytes`` at device address ``va`` to the host (synchronous)."""
        self._bind()
        buf = bytearray(nbytes)
        ptr = ctypes.addressof((ctypes.c_char * nbytes).from_buffer(buf))
        call("cuMemcpyDtoH", self._cu.cuMemcpyDtoH, ptr, va, nbytes)
        return bytes(buf)

    def tensor(self, va: int, nbytes: int, dtype: Any = None):
        """A flat torch CUDA tensor over ``[va, va+nbytes)`` (inside one reservation); no copy,
        no ownership. The KV views of :mod:`workbench.tensors` are cut from it."""
        from workbench.gpu.tensors import from_pointer  # torch only when views are asked for

        if not self._inside(va, nbytes):
            raise DeviceError("view", f"{va:#x}+{nbytes} is outside every reservation")
        self._bind()
        t = from_pointer(va, nbytes, self.index)
        return t if dtype is None else t.view(dtype)

    def synchronize(self) -> None:
        self._bind()
        call("cuCtxSynchronize", self._cu.cuCtxSynchronize)

    @property
    def mapped_bytes(self) -> int:
        return sum(s for s, _ in self.mappings.values())

    def close(self) -> None:
        """Give back everything this object holds: mappings, handles, reservations, zero page."""
        self._bind()
        for va, (size, _) in list(self.mappings.items()):
            self.unmap(va, size)
        for hid in list(self._alloc):
            self.release(hid)
        self.occupied.clear()
        for va, size in list(self.reservations.items()):
            self.unreserve(va, size)
        if self.zero is not None:
            self.zero.close()
        if self._fast is not None:
            self._fast.close()
            self._fast = None

    def __repr__(self) -> str:
        return (f"CudaDevice({self.name!r}, granularity={self.granularity}, "
                f"zero_access={self.zero_access})")
