"""A page id's driver calls in one Python call each way, for :class:`~workbench.gpu.device.
CudaDevice`: the same refusals, driver calls and errors as its separate ``create``/``map``/
``set_access``/``unmap``/``release``, without their per-call Python (a PER_LAYER page id of a
32-layer model is 192 calls). :class:`~workbench.core.vspace.KVSpace` uses them when the device's
class has them; wrappers such as ``FaultyDevice`` keep the per-call path, so injected faults still
see every call. The methods read the device's driver handle, descriptors and tables.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable
from time import perf_counter

from workbench.errors import DeviceError
from workbench.gpu.driver import fail
from workbench.gpu.fastbatch import PYTHON, FastBatch


class BatchCalls(FastBatch):
    # (cuMemCreate, cuMemMap, cuMemSetAccess, prop, rw access, zero page, handle table,
    # mappings, mapping starts, mapped-handle counts, granularity): read in one unpacking
    _hot: tuple

    def _prepare_hot(self) -> None:
        """Gather what the batched calls read, once (every item lives as long as the device)."""
        cu, m = self._cu, self.mappings
        self._hot = (cu.cuMemCreate, cu.cuMemMap, cu.cuMemSetAccess, self._prop, self._rw,
                     self.zero, self._alloc, m, m.starts, m.handles, self.granularity)

    def map_targets(self, targets: Iterable[tuple[int, int]]) -> list[int]:
        """create + map + set_access for each ``(va, size)`` in order: the same refusals, driver
        calls and errors as the separate calls, without their per-call Python. On a failure
        the DeviceError carries ``partial = (handles created, targets mapped)``: the state the
        separate calls would have left, for the caller's undo. Through the C fast path where
        the device has one (:mod:`workbench.gpu.fastbatch`)."""
        t0 = perf_counter()
        if threading.get_ident() not in self._bound:
            self._bind()
        try:
            if self._fast is not None:
                if type(targets) is not tuple:
                    targets = tuple(targets)
                with self._fast.lock:
                    created = self._fast_map(targets)
                if created is not PYTHON:
                    return created
            return self._map_each(targets)
        finally:
            self._busy += perf_counter() - t0

    def _map_each(self, targets: Iterable[tuple[int, int]]) -> list[int]:
        """``map_targets`` in Python, call by call."""
        create, cumap, access, prop, rw, zero, alloc, mappings, starts, counts, g = self._hot
        lo, hi = self._last_reservation  # the one the last target was in (a pool maps there)
        created: list[int] = []
        n = 0
        try:
            for va, size in targets:
                if type(size) is not int or size <= 0 or size % g:
                    self._refuse_size("create", size)
                err, h = create(size, prop, 0)
                if err:
                    raise fail("create", err)
                hid = int(h)
                alloc[hid] = (h, size)
                self._delta += size
                created.append(hid)
                if not lo <= va < va + size <= hi:
                    r = self.reservations.holding(va)
                    if r is not None:
                        lo, hi = self._last_reservation = r, r + self.reservations[r]
                # the overlap refusal inlined: a mapping starting inside, or the one before
                # reaching in (one bisect)
                i = bisect_left(starts, va)
                if (not lo <= va < va + size <= hi or (i < len(starts) and starts[i] < va + size)
                        or (i and starts[i - 1] + mappings[starts[i - 1]][0] > va)):
                    self._refuse_map(va, size, hid, size)  # raises the refusal's own message
                if zero is not None:
                    zero.clear(va, size)
                err = cumap(va, size, 0, h, 0)[0]
                if err:
                    if zero is not None:
                        self._rezero(va, size)
                    raise fail("map", err)
                starts.insert(i, va)  # MapTable.add, inlined
                dict.__setitem__(mappings, va, (size, hid))
                counts[hid] = counts.get(hid, 0) + 1
                n += 1
                err = access(va, size, rw, 1)[0]
                if err:
                    raise fail("set_access", err)
        except DeviceError as err:
            err.partial = (created, n)
            raise
        return created

    def unmap_targets(self, targets: Iterable[tuple[int, int]]) -> None:
        """``unmap`` each ``(va, size)`` in order; on a failure the DeviceError carries
        ``partial``, the number unmapped before it."""
        t0 = perf_counter()
        if threading.get_ident() not in self._bound:
            self._bind()
        try:
            self._unmap_each(targets, rezero=True)
        finally:
            self._busy += perf_counter() - t0

    def unmap_release(self, targets: Iterable[tuple[int, int]],
                      handles: list[int]) -> DeviceError | None:
        """Unmap every target, release every handle, then the zero page back on the targets:
        the bare calls' order (an H200 released ~25 µs slower right after a zero set-access).
        An unmap failure raises like ``unmap_targets`` (nothing released, zeros back on what
        it unmapped); a release failure is returned (``partial`` = released), zeros back."""
        t0 = perf_counter()
        if threading.get_ident() not in self._bound:
            self._bind()
        if type(targets) is not tuple:
            targets = tuple(targets)
        zero = self.zero
        failed: DeviceError | None = None
        try:
            if self._fast is not None:
                with self._fast.lock:
                    out = self._fast_unmap_release(targets, handles)
                if out is not PYTHON:
                    return out
            try:
                self._unmap_each(targets, rezero=False)
            except DeviceError as err:
                if zero is not None:
                    for va, size in targets[:err.partial]:
                        zero.put(va, size)
                raise
            try:
                self._release_each(handles)
            except DeviceError as err:
                failed = err
            if zero is not None:
                for va, size in targets:
                    zero.put(va, size)
        finally:
            self._busy += perf_counter() - t0
        return failed

    def release_handles(self, handles: Iterable[int]) -> None:
        """``release`` each handle in order; on a failure the DeviceError carries ``partial``,
        the number released before it."""
        t0 = perf_counter()
        if threading.get_ident() not in self._bound:
            self._bind()
        try:
            self._release_each(handles)
        finally:
            self._busy += perf_counter() - t0

    def _unmap_each(self, targets: Iterable[tuple[int, int]], rezero: bool) -> None:
        """The unmap loop (tables updated inline); ``rezero`` puts each target's zero piece
        back right after it. A failure's DeviceError carries ``partial`` (unmapped before)."""
        hot = self._hot
        unmap, mappings, starts, counts = self._cu.cuMemUnmap, hot[7], hot[8], hot[9]
        get = mappings.get
        zero = self.zero if rezero else None
        n = 0
        try:
            for va, size in targets:
                m = get(va)
                if m is None or m[0] != size:
                    self._refuse_unmapped("unmap", va, size)
                err = unmap(va, size)[0]
                if err:
                    raise fail("unmap", err)
                dict.__delitem__(mappings, va)  # MapTable's del, inlined
                del starts[bisect_left(starts, va)]
                hid = m[1]
                if counts[hid] > 1:
                    counts[hid] -= 1
                else:
                    del counts[hid]
                n += 1
                if zero is not None:
                    zero.put(va, size)
        except DeviceError as err:
            err.partial = n
            raise

    def _release_each(self, handles: Iterable[int]) -> None:
        """The release loop; a failure's DeviceError carries ``partial`` (released before)."""
        hot = self._hot
        release, alloc, mapped = self._cu.cuMemRelease, hot[6], hot[9]
        n = 0
        try:
            for hid in handles:
                entry = alloc.get(hid)
                if entry is None or hid in mapped:
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
