"""The zero page: physical zeros behind every unbacked byte of every reservation.

Two facts measured on an H200 shape this. VMM calls cost per *mapping*, not per byte
(create+map+set_access of a 128 MiB compound page costs about what a 2 MiB one does, and
unmapping 64 2 MiB mappings took ~1.6 ms, one 128 MiB mapping ~12 µs), and ``cuMemMap`` only
maps a *whole* allocation (a piece of a bigger handle is CUDA_ERROR_NOT_SUPPORTED). So:

* a reservation starts as ``granularity``-sized zero pieces (any range tiles with them);
* unbacking a range (``fill`` after an unmap) maps **one** zero piece of exactly that size, from
  a zero handle kept per size (sizes up to ``max_exact``; bigger ranges fall back to chunks);
* backing a range (``clear`` before a map) unmaps the pieces under it in one call and refills
  any edge it cut with granularity chunks.

Pieces therefore settle at the pool's target size (one per compound page id in the CONTIGUOUS
layout, one per 2 MiB target in PER_LAYER): in steady state a grow pays one extra unmap and a
shrink one extra map and set-access. The cost is one zero handle per distinct target size (the
compound page id, 128 MiB for a 32-layer model, like kvcached's compound zero page) plus one
chunk. A failed fill leaves a hole (no piece): reads there fault, nothing leaks.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from workbench.errors import DeviceError
from workbench.gpu.driver import call, fail
from workbench.units import MiB


class ZeroPage:
    def __init__(self, cu: Any, prop: Any, granularity: int, rw: list, ro: list,
                 max_exact: int = 256 * MiB, writable: bool = False):
        self.cu, self.prop, self.g = cu, prop, granularity
        self.max_exact = max_exact
        self._rw, self._ro = rw, ro
        # "read" or "readwrite", probed on the first fill; ``writable`` asks for "readwrite" (an
        # engine's KV pool: a stray write to an unbacked slot lands here instead of faulting)
        self.access: str | None = "readwrite" if writable else None
        self._desc = rw if writable else ro
        self.handles: dict[int, Any] = {}  # size -> a zero-filled allocation of that size
        # piece starts, sorted on demand: the steady state adds and drops exact pieces by their
        # start alone, and keeping a list of thousands sorted on every one cost ~1 µs each
        self._sorted: list[int] | None = []
        self._size: dict[int, int] = {}  # piece start -> size
        self.multi_unmap = True  # one cuMemUnmap may span several pieces (probed)

    @property
    def pieces(self) -> int:
        return len(self._size)

    @property
    def held_bytes(self) -> int:
        """Physical memory the zero handles take."""
        return sum(self.handles)

    def _handle(self, n: int) -> Any:
        h = self.handles.get(n)
        if h is None:
            h = self.handles[n] = self._make(n)
        return h

    def _make(self, n: int) -> Any:
        """A zero-filled allocation of ``n`` bytes, cleared through a temporary writable mapping
        (cuMemCreate promises no contents)."""
        cu = self.cu
        h = call("cuMemCreate(zero)", cu.cuMemCreate, n, self.prop, 0)
        va = 0
        try:
            va = int(call("cuMemAddressReserve", cu.cuMemAddressReserve, n, self.g, 0, 0))
            call("cuMemMap", cu.cuMemMap, va, n, 0, h, 0)
            call("cuMemSetAccess", cu.cuMemSetAccess, va, n, self._rw, 1)
            call("cuMemsetD8", cu.cuMemsetD8, va, 0, n)
            call("cuCtxSynchronize", cu.cuCtxSynchronize)
            call("cuMemUnmap", cu.cuMemUnmap, va, n)
            call("cuMemAddressFree", cu.cuMemAddressFree, va, n)
        except DeviceError:
            if va:
                cu.cuMemUnmap(va, n)
                cu.cuMemAddressFree(va, n)
            cu.cuMemRelease(h)
            raise
        return h

    def fill(self, va: int, size: int, exact: bool = True) -> None:
        """Map zeros over ``[va, va+size)``: all of it, or (raising DeviceError) none of it.
        ``exact``: one piece of that size (if not above ``max_exact``), else chunks."""
        cu = self.cu
        step = size if exact and size <= self.max_exact else self.g
        if step == size and self.access is not None:  # the steady state: one piece, one call
            self._fill_one(va, size)
            return
        zero = self._handle(step)
        done: list[tuple[int, int]] = []
        try:
            pos, end = va, va + size
            while pos < end:
                n = step
                err = cu.cuMemMap(pos, n, 0, zero, 0)[0]
                if err:
                    raise fail("cuMemMap(zero)", err)
                done.append((pos, n))
                pos += n
            if self.access is None:  # read-only where the driver takes it
                if cu.cuMemSetAccess(va, size, self._ro, 1)[0]:
                    self._desc = self._rw
                self.access = "read" if self._desc is self._ro else "readwrite"
            err = cu.cuMemSetAccess(va, size, self._desc, 1)[0]
            if err:
                raise fail("cuMemSetAccess(zero)", err)
        except DeviceError:
            self._unmap_runs(done)
            raise
        for s, n in done:
            self._size[s] = n
        self._sorted = None

    def put(self, va: int, size: int) -> None:
        """``fill(va, size)`` at best effort (an unmapped range's zeros coming back): a failure
        leaves a hole, whose reads fault, and nothing else. The steady state is written out."""
        h = self.handles.get(size) if self.access is not None and size <= self.max_exact else None
        if h is None:
            try:
                self.fill(va, size)
            except DeviceError:
                pass
            return
        cu = self.cu
        if cu.cuMemMap(va, size, 0, h, 0)[0]:
            return
        if cu.cuMemSetAccess(va, size, self._desc, 1)[0]:
            try:
                self._unmap_runs([(va, size)])
            except DeviceError:
                pass
            return
        self._size[va] = size
        self._sorted = None

    def _fill_one(self, va: int, size: int) -> None:
        """``fill`` of one exact piece, once the access mode is known."""
        cu = self.cu
        err = cu.cuMemMap(va, size, 0, self._handle(size), 0)[0]
        if err:
            raise fail("cuMemMap(zero)", err)
        err = cu.cuMemSetAccess(va, size, self._desc, 1)[0]
        if err:
            self._unmap_runs([(va, size)])
            raise fail("cuMemSetAccess(zero)", err)
        self._size[va] = size
        self._sorted = None

    def _starts(self) -> list[int]:
        if self._sorted is None:
            self._sorted = sorted(self._size)
        return self._sorted

    def _overlapping(self, va: int, size: int) -> list[tuple[int, int]]:
        starts, out = self._starts(), []
        i = max(0, bisect_right(starts, va) - 1)
        while i < len(starts) and starts[i] < va + size:
            s = starts[i]
            if s + self._size[s] > va:
                out.append((s, self._size[s]))
            i += 1
        return out

    def _unmap_runs(self, pieces: list[tuple[int, int]]) -> None:
        """Unmap ``pieces`` (sorted), one call per run of adjacent pieces where allowed."""
        cu = self.cu
        runs: list[list[int]] = []
        for s, n in pieces:
            if runs and runs[-1][1] == s and self.multi_unmap:
                runs[-1][1] = s + n
            else:
                runs.append([s, s + n])
        for s, e in runs:
            err = cu.cuMemUnmap(s, e - s)[0]
            if not err:
                continue
            run = [(p, n) for p, n in pieces if s <= p < e]
            if len(run) == 1:
                raise fail("cuMemUnmap(zero)", err)
            self.multi_unmap = False  # this driver wants one unmap per mapping
            for p, n in run:
                call("cuMemUnmap(zero)", cu.cuMemUnmap, p, n)

    def _forget(self, pieces: list[tuple[int, int]]) -> None:
        for s, _ in pieces:
            del self._size[s]
        self._sorted = None

    def clear(self, va: int, size: int) -> None:
        """Take the zeros off ``[va, va+size)`` so it can be mapped; the edges keep theirs."""
        if self._size.get(va) == size:  # the steady state: one piece of exactly this range
            err = self.cu.cuMemUnmap(va, size)[0]
            if err:
                raise fail("cuMemUnmap(zero)", err)
            del self._size[va]
            self._sorted = None
            return
        pieces = self._overlapping(va, size)
        if not pieces:
            return
        self._unmap_runs(pieces)
        self._forget(pieces)
        lo, (ls, ln) = pieces[0][0], pieces[-1]
        hi = ls + ln
        if lo < va:
            self._refill_edge(lo, va - lo)
        if hi > va + size:
            self._refill_edge(va + size, hi - va - size)

    def _refill_edge(self, va: int, size: int) -> None:
        try:
            self.fill(va, size, exact=False)  # odd sizes get chunks, not a handle of their own
        except DeviceError:
            pass  # a hole: unbacked reads there fault, but nothing is lost or leaked

    def release_range(self, va: int, size: int) -> None:
        """Unmap every piece inside ``[va, va+size)`` (before the reservation goes)."""
        pieces = self._overlapping(va, size)
        self._unmap_runs(pieces)
        self._forget(pieces)

    def close(self) -> None:
        if self._size:
            raise DeviceError("zero page", f"{len(self._size)} pieces are still mapped")
        for n in list(self.handles):
            call("cuMemRelease(zero)", self.cu.cuMemRelease, self.handles.pop(n))
