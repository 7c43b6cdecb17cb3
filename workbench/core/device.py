"""The device interface: what a backend supplies (memory, mappings, time). It decides nothing.

The calls mirror CUDA's virtual-memory API one for one, so the core above drives a simulated GPU,
a real one (``cuMem*``) or Linux virtual memory (``mmap``/memfd) with the same code:

====================  ============================  ==========================================
call                  CUDA driver                   meaning
====================  ============================  ==========================================
``reserve(size)``     cuMemAddressReserve           virtual range, backed by the zero page
``create(size)``      cuMemCreate                   physical memory, returns a handle
``map(va, size, h)``  cuMemMap                      back ``[va, va+size)`` with handle ``h``
``set_access(va, n)`` cuMemSetAccess                make the mapped range readable/writable
``unmap(va, size)``   cuMemUnmap                    drop the backing; the zero page returns
``release(h)``        cuMemRelease                  free the physical memory
``mem_info()``        cuMemGetInfo                  device-wide free and total bytes
====================  ============================  ==========================================

Every failing call raises :class:`~workbench.errors.DeviceError` (never aborts). ``now()`` is the
device's clock in seconds and ``busy_s`` the total time spent inside calls: on the simulated
backend both are simulated time (each call costs a preset latency), elsewhere wall time. A SimPy
process that calls into the core yields ``busy_s`` after minus before.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import NamedTuple, Protocol, runtime_checkable

from workbench.errors import ConfigError, DeviceError, InjectedFault

VMM_OPS = ("reserve", "create", "map", "set_access", "unmap", "release")


class MemInfo(NamedTuple):
    free: int
    total: int


@runtime_checkable
class Device(Protocol):
    """One GPU's (or host's) physical memory as seen by one process."""

    name: str
    granularity: int  # bytes; page sizes must be a multiple

    def reserve(self, size: int) -> int: ...
    def unreserve(self, va: int, size: int) -> None: ...
    def create(self, size: int) -> int: ...
    def map(self, va: int, size: int, handle: int) -> None: ...
    def set_access(self, va: int, size: int) -> None: ...
    def unmap(self, va: int, size: int) -> None: ...
    def release(self, handle: int) -> None: ...
    def mem_info(self) -> MemInfo: ...
    def now(self) -> float: ...
    @property
    def busy_s(self) -> float: ...


class SpanTable(dict):
    """``va -> size`` with the starts kept sorted, so "which span holds this address" is a bisect
    rather than a scan (a 32-layer pool in the per-layer layout maps thousands of spans). Every
    write goes through ``[]=``, ``del``, ``pop`` or ``clear``, which keep the index in step."""

    __slots__ = ("starts",)

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[int] = []

    def __setitem__(self, va: int, value) -> None:
        if va not in self:
            insort(self.starts, va)
        dict.__setitem__(self, va, value)

    def __delitem__(self, va: int) -> None:
        dict.__delitem__(self, va)
        del self.starts[bisect_left(self.starts, va)]

    def pop(self, va: int, *default):
        if va in self:
            value = self[va]
            del self[va]
            return value
        return dict.pop(self, va, *default)

    def clear(self) -> None:
        dict.clear(self)
        self.starts.clear()

    def update(self, *args, **kw) -> None:
        for va, value in dict(*args, **kw).items():
            self[va] = value

    def span(self, va: int) -> int:
        return self[va]

    def holding(self, va: int) -> int | None:
        """The start of the span that contains ``va``, or None."""
        i = bisect_right(self.starts, va) - 1
        if i >= 0 and va < self.starts[i] + self.span(self.starts[i]):
            return self.starts[i]
        return None

    def any_within(self, va: int, size: int) -> bool:
        """Whether a span starts inside ``[va, va+size)``."""
        i = bisect_left(self.starts, va)
        return i < len(self.starts) and self.starts[i] < va + size


class MapTable(SpanTable):
    """``va -> (size, handle)``, also counting how many spans map each handle."""

    __slots__ = ("handles",)

    def __init__(self) -> None:
        super().__init__()
        self.handles: dict[int, int] = {}  # a plain dict: Counter's __missing__ cost every map

    def __setitem__(self, va: int, value: tuple[int, int]) -> None:
        old = self.get(va)
        if old is not None:
            self._drop_handle(old[1])
        SpanTable.__setitem__(self, va, value)
        h = value[1]
        self.handles[h] = self.handles.get(h, 0) + 1

    def add(self, va: int, size: int, handle: int) -> None:
        """``self[va] = (size, handle)`` for a ``va`` known to be unmapped (checked by the
        caller's overlap refusal), without the replace bookkeeping."""
        insort(self.starts, va)
        dict.__setitem__(self, va, (size, handle))
        self.handles[handle] = self.handles.get(handle, 0) + 1

    def __delitem__(self, va: int) -> None:
        handle = self[va][1]
        SpanTable.__delitem__(self, va)
        self._drop_handle(handle)

    def _drop_handle(self, handle: int) -> None:
        n = self.handles[handle] - 1
        if n:
            self.handles[handle] = n
        else:
            del self.handles[handle]

    def clear(self) -> None:
        SpanTable.clear(self)
        self.handles.clear()

    def span(self, va: int) -> int:
        return self[va][0]


class DriverRefusals:
    """The refusals a CUDA driver makes, one copy for every device (sim, host and CUDA).

    A device keeps ``reservations`` (a :class:`SpanTable`, va -> size) and ``mappings`` (a
    :class:`MapTable`, va -> (size, handle)) and calls these checks before touching real memory,
    so a core bug fails alike on every backend. "Already mapped" is the driver's overlap rule:
    a map onto *any* byte that is already mapped is refused, not only one at the same start.
    """

    granularity: int
    reservations: SpanTable
    mappings: MapTable
    # True where work queued earlier (kernels on streams) may still read a page after the host
    # frees it, so an engine's pool releases behind a fence (CUDA); sim and host act at once
    queued_work: bool = False
    # the torch device a tensor view over this device's memory lives on ("cpu", "cuda:N");
    # None where the memory is simulated (no bytes: no views, no tokens)
    torch_device: str | None = None

    def _init_tables(self) -> None:
        self.reservations = SpanTable()
        self.mappings = MapTable()

    def _inside(self, va: int, size: int) -> bool:
        r = self.reservations.holding(va)
        return r is not None and va + size <= r + self.reservations[r]

    def _overlaps(self, va: int, size: int) -> bool:
        """A mapping starts inside ``[va, va+size)``, or the one before ``va`` reaches past it
        (one bisect: this runs before every map)."""
        m = self.mappings
        starts = m.starts
        i = bisect_left(starts, va)
        if i < len(starts) and starts[i] < va + size:
            return True
        return i > 0 and starts[i - 1] + m.span(starts[i - 1]) > va

    def _refuse_size(self, op: str, size: int) -> None:
        if not isinstance(size, int) or size <= 0 or size % self.granularity:
            raise DeviceError(op, f"size {size} is not a positive multiple of {self.granularity}")

    def _refuse_unreserve(self, va: int, size: int) -> None:
        if self.reservations.get(va) != size:
            raise DeviceError("unreserve", f"no reservation of {size} bytes at {va:#x}")
        if self.mappings.any_within(va, size):
            raise DeviceError("unreserve", "range still has mappings")

    def _refuse_map(self, va: int, size: int, handle: int, handle_size: int | None) -> None:
        if handle_size != size:
            raise DeviceError("map", f"handle {handle} is not a live {size}-byte allocation")
        if not self._inside(va, size):
            raise DeviceError("map", f"{va:#x}+{size} is outside every reservation")
        if self._overlaps(va, size):
            raise DeviceError("map", f"{va:#x}+{size} is already mapped (overlaps a mapping)")

    def _refuse_unmapped(self, op: str, va: int, size: int) -> None:
        m = self.mappings.get(va)
        if m is None or m[0] != size:
            raise DeviceError(op, f"{va:#x}+{size} is not mapped")

    def _refuse_release(self, handle: int, known: bool) -> None:
        if not known:
            raise DeviceError("release", f"unknown handle {handle}")
        if handle in self.mappings.handles:
            raise DeviceError("release", f"handle {handle} is still mapped")


class DeviceWrapper:
    """A device over ``inner``: every call and fact passes through unchanged; a wrapper
    overrides only the calls it changes (the faults, a budget). Backend extras (tensor views)
    pass through ``__getattr__``; the batched fast paths do not, since ``KVSpace`` looks them up
    on the class."""

    def __init__(self, inner: Device):
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def granularity(self) -> int:
        return self.inner.granularity

    @property
    def busy_s(self) -> float:
        return self.inner.busy_s

    @property
    def queued_work(self) -> bool:
        return getattr(self.inner, "queued_work", False)

    @property
    def torch_device(self) -> str | None:
        return getattr(self.inner, "torch_device", None)

    def reserve(self, size: int) -> int:
        return self.inner.reserve(size)

    def unreserve(self, va: int, size: int) -> None:
        self.inner.unreserve(va, size)

    def create(self, size: int) -> int:
        return self.inner.create(size)

    def map(self, va: int, size: int, handle: int) -> None:
        self.inner.map(va, size, handle)

    def set_access(self, va: int, size: int) -> None:
        self.inner.set_access(va, size)

    def unmap(self, va: int, size: int) -> None:
        self.inner.unmap(va, size)

    def release(self, handle: int) -> None:
        self.inner.release(handle)

    def mem_info(self) -> MemInfo:
        return self.inner.mem_info()

    def now(self) -> float:
        return self.inner.now()

    def __getattr__(self, item: str):
        return getattr(self.inner, item)


class FaultyDevice(DeviceWrapper):
    """Wraps a device so that the Nth call of a kind fails (1-based, counted per kind).

    ``FaultyDevice(dev, {"map": [3], "unmap": [1]})`` makes the third ``map`` and the first
    ``unmap`` raise :class:`InjectedFault` *before* touching the inner device, exactly like a driver
    call that returned an error. ``counts`` shows how many calls of each kind were made.
    """

    def __init__(self, inner: Device, plan: Mapping[str, Iterable[int]] | None = None):
        super().__init__(inner)
        self.plan: dict[str, set[int]] = {}
        self.counts: Counter[str] = Counter()
        self.injected: list[tuple[str, int]] = []
        for op, ns in (plan or {}).items():
            self.fail(op, *ns)

    def fail(self, op: str, *nth: int) -> None:
        """Schedule the ``nth`` calls (counted from the start) of ``op`` to fail."""
        if op not in VMM_OPS:
            raise ConfigError(f"fault op {op!r}", f"not one of {', '.join(VMM_OPS)}",
                              "name a device call")
        self.plan.setdefault(op, set()).update(nth)

    def fail_next(self, op: str, k: int = 1) -> None:
        """Make the next call of ``op`` (``k``-th from now) fail."""
        self.fail(op, self.counts[op] + k)

    def _tick(self, op: str) -> None:
        self.counts[op] += 1
        if self.counts[op] in self.plan.get(op, ()):
            self.injected.append((op, self.counts[op]))
            raise InjectedFault(op, f"injected failure of call #{self.counts[op]}")

    # -- the calls that can fail ---------------------------------------------------------------
    def reserve(self, size: int) -> int:
        self._tick("reserve")
        return self.inner.reserve(size)

    def create(self, size: int) -> int:
        self._tick("create")
        return self.inner.create(size)

    def map(self, va: int, size: int, handle: int) -> None:
        self._tick("map")
        self.inner.map(va, size, handle)

    def set_access(self, va: int, size: int) -> None:
        self._tick("set_access")
        self.inner.set_access(va, size)

    def unmap(self, va: int, size: int) -> None:
        self._tick("unmap")
        self.inner.unmap(va, size)

    def release(self, handle: int) -> None:
        self._tick("release")
        self.inner.release(handle)
