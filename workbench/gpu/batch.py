"""A page id's driver calls in one Python call each way, for :class:`~workbench.gpu.device.
CudaDevice`: the same refusals, driver calls and errors as its separate ``create``/``map``/
``set_access``/``unmap``/``release``, without their per-call Python (a PER_LAYER page id of a
32-layer model is 192 calls). :class:`~workbench.core.vspace.KVSpace` uses them when the device's
class has them; wrappers such as ``FaultyDevice`` keep the per-call path, so injected faults still
see every call. The methods read the device's driver handle, descriptors and tables.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from time import perf_counter

from workbench.errors import DeviceError
from workbench.gpu.driver import fail


class BatchCalls:
    def map_targets(self, targets: Iterable[tuple[int, int]]) -> list[int]:
        """create + map + set_access for each ``(va, size)`` in order: the same refusals, driver
        calls and errors as the separate calls, without their per-call Python. On a failure
        the DeviceError carries ``partial = (handles created, targets mapped)``: the state the
        separate calls would have left, for the caller's undo."""
        t0 = perf_counter()
        if threading.get_ident() not in self._bound:
            self._bind()
        cu, prop, rw, zero, alloc = self._cu, self._prop, self._rw, self.zero, self._alloc
        rs, mappings = self.reservations, self.mappings
        lo = hi = 0  # the reservation the last target was inside (a page's targets share one)
        created: list[int] = []
        n = 0
        try:
            for va, size in targets:
                self._refuse_size("create", size)
                err, h = cu.cuMemCreate(size, prop, 0)
                if err:
                    raise fail("create", err)
                hid = int(h)
                alloc[hid] = (h, size)
                self._delta += size
                created.append(hid)
                if not lo <= va < va + size <= hi:
                    r = rs.holding(va)
                    if r is not None:
                        lo, hi = r, r + rs[r]
                if not lo <= va < va + size <= hi or self._overlaps(va, size):
                    self._refuse_map(va, size, hid, size)  # raises the refusal's own message
                if zero is not None:
                    zero.clear(va, size)
                err = cu.cuMemMap(va, size, 0, h, 0)[0]
                if err:
                    if zero is not None:
                        self._rezero(va, size)
                    raise fail("map", err)
                mappings.add(va, size, hid)
                n += 1
                err = cu.cuMemSetAccess(va, size, rw, 1)[0]
                if err:
                    raise fail("set_access", err)
        except DeviceError as err:
            err.partial = (created, n)
            raise
        finally:
            self._busy += perf_counter() - t0
        return created

    def unmap_targets(self, targets: Iterable[tuple[int, int]], rezero: bool = True) -> None:
        """``unmap`` each ``(va, size)`` in order; on a failure the DeviceError carries
        ``partial``, the number unmapped before it. ``rezero=False`` leaves the zero page off
        the unmapped ranges until :meth:`zero_targets` (a release is ~25 µs slower on an H200
        right after a zero page's set-access, so a caller about to release maps zeros after)."""
        t0 = perf_counter()
        if threading.get_ident() not in self._bound:
            self._bind()
        unmap, mappings = self._cu.cuMemUnmap, self.mappings
        zero = self.zero if rezero else None
        n = 0
        try:
            for va, size in targets:
                self._refuse_unmapped("unmap", va, size)
                err = unmap(va, size)[0]
                if err:
                    raise fail("unmap", err)
                del mappings[va]
                n += 1
                if zero is not None:
                    self._rezero(va, size)
        except DeviceError as err:
            err.partial = n
            raise
        finally:
            self._busy += perf_counter() - t0

    def zero_targets(self, targets: Iterable[tuple[int, int]]) -> None:
        """Put the zero page back on ranges :meth:`unmap_targets` left bare (best effort, as
        ``unmap`` does: a failure leaves a hole whose reads fault)."""
        if self.zero is None:
            return
        t0 = perf_counter()
        if threading.get_ident() not in self._bound:
            self._bind()
        for va, size in targets:
            self._rezero(va, size)
        self._busy += perf_counter() - t0

    def release_handles(self, handles: Iterable[int]) -> None:
        """``release`` each handle in order; on a failure the DeviceError carries ``partial``,
        the number released before it."""
        t0 = perf_counter()
        if threading.get_ident() not in self._bound:
            self._bind()
        release, alloc = self._cu.cuMemRelease, self._alloc
        n = 0
        try:
            for hid in handles:
                entry = alloc.get(hid)
                self._refuse_release(hid, entry is not None)
                err = release(entry[0])[0]
                if err:
                    raise fail("release", err)
                del alloc[hid]
                self._delta -= entry[1]
                n += 1
        except DeviceError as err:
            err.partial = n
            raise
        finally:
            self._busy += perf_counter() - t0
