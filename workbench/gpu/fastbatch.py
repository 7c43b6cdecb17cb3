""":class:`~workbench.gpu.batch.BatchCalls` through the C fast path (:mod:`.fastcalls`).

The Python checks every refusal *before* the C call and takes the C path only when none applies
(every size a positive multiple of the granularity, every target inside a reservation, on no
mapping, in ascending order without overlap, each zero piece exactly the target; an unmap's
targets each mapped by the matching handle and by nothing else). Anything else (a refusal to
raise, an odd zero piece, repeated targets) returns :data:`PYTHON` and the Python batch runs, so
the refusals, their messages and their order are that path's own. After the C call the tables
are brought to what the separate calls leave, and a failure raises the DeviceError the Python
path raises, with the same ``partial``.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from workbench.errors import DeviceError
from workbench.gpu.fastcalls import (
    HEAD,
    J_DONE,
    J_M,
    J_N,
    J_RELEASED,
    J_STAGE,
    J_ZDESC,
    OUT0,
    S_ACCESS,
    S_CREATE,
    S_MAP,
    S_RELEASE,
    S_UNMAP,
    T_WORDS,
    TARGET,
    FastCalls,
)

PYTHON = object()  # "not for the C path": the caller runs its Python batch


class FastBatch:
    _fast: FastCalls | None
    _hot: tuple
    _last_reservation: tuple[int, int]
    _delta: int
    reservations: Any
    zero: Any

    def _fast_map(self, targets: tuple) -> Any:
        """``map_targets`` in one C call, or PYTHON. See the module docstring."""
        fast = self._fast
        _, _, _, _, _, zero, alloc, mappings, starts, counts, g = self._hot
        zsize = zero._size if zero is not None else None
        n = len(targets)
        if n > fast.capacity:
            fast.ensure(n)
        call, _, arg, words, raw = fast.hot
        lo, hi = self._last_reservation
        end, off = 0, 8 * HEAD  # the previous target's end (targets ascend, apart); bytes
        pack = TARGET.pack_into
        for va, size in targets:
            if type(size) is not int or type(va) is not int or size <= 0 or size % g or va < end:
                return PYTHON
            end = va + size
            if not lo <= va < end <= hi:
                r = self.reservations.holding(va)
                if r is None or end > r + self.reservations[r]:
                    return PYTHON
                lo, hi = self._last_reservation = r, r + self.reservations[r]
            k = bisect_left(starts, va)
            if ((k < len(starts) and starts[k] < end)
                    or (k and starts[k - 1] + mappings[starts[k - 1]][0] > va)):
                return PYTHON
            if zsize is not None and zsize.get(va) != size:
                return PYTHON  # no piece or a piece of another size: the Python clear
            pack(raw, off, va, size, zsize is not None)
            off += 32
        words[J_N] = n
        if call(arg):
            return self._fast_map_failed(targets, words[J_STAGE], words[J_DONE])
        if n == 1:  # one compound target (the CONTIGUOUS layout): no loop
            hid = words[OUT0]
            alloc[hid] = (hid, size)
            self._delta += size
            if zsize is not None:
                del zsize[va]  # ZeroPage.clear's steady state
                zero._sorted = None
            starts.insert(k, va)  # MapTable.add, inlined (k: its place, found above)
            dict.__setitem__(mappings, va, (size, hid))
            counts[hid] = 1  # a new handle maps nothing else
            return [hid]
        created = words[OUT0:OUT0 + T_WORDS * n:T_WORDS].tolist()
        total = 0
        for (va, size), hid in zip(targets, created, strict=True):
            alloc[hid] = (hid, size)
            total += size
            if zsize is not None:
                del zsize[va]
                zero._sorted = None
            starts.insert(bisect_left(starts, va), va)
            dict.__setitem__(mappings, va, (size, hid))
            counts[hid] = 1
        self._delta += total
        return created

    def _fast_map_failed(self, targets: tuple, stage: int, done: int) -> Any:
        """The tables after a C map batch stopped at ``stage`` of target ``done`` (``done``
        targets mapped, or ``done - 1`` with access when the access failed), and its error."""
        fast = self._fast
        _, _, _, _, _, zero, alloc, mappings, starts, counts, _ = self._hot
        made = done if stage == S_CREATE or stage == S_ACCESS else done + 1
        created = fast.out(made)
        for i in range(made):
            va, size = targets[i]
            hid = created[i]
            alloc[hid] = (hid, size)
            self._delta += size
            if zero is not None and (i < done or stage >= S_MAP):
                del zero._size[va]
                zero._sorted = None
            if i < done:
                starts.insert(bisect_left(starts, va), va)
                dict.__setitem__(mappings, va, (size, hid))
                counts[hid] = counts.get(hid, 0) + 1
        if stage == S_MAP and zero is not None:
            self._rezero(*targets[done])
        err = fast.error(stage)
        err.partial = (created, done)
        raise err

    def _fast_unmap_release(self, targets: tuple, handles: list[int]) -> Any:
        """``unmap_release`` in one C call (the DeviceError of a failed release, or None), or
        PYTHON. See the module docstring. The C call also puts the zero pieces back where
        ``ZeroPage.put`` would take its steady state on every target (a zero handle of each
        target's size, access known); else ``put`` runs here after it."""
        fast = self._fast
        _, _, _, _, _, zero, alloc, mappings, starts, counts, _ = self._hot
        cz = self._pack_unmap_release(targets, handles)
        if cz is PYTHON:
            return PYTHON
        n = len(targets)
        _, call, arg, words, _ = fast.hot
        (va, size), hid = targets[-1], handles[-1]  # the one target of a compound page
        stage = words[J_STAGE] if call(arg) else 0
        if not stage and n == 1:  # one compound target, all done: no loop
            dict.__delitem__(mappings, va)  # MapTable's del, inlined
            del starts[bisect_left(starts, va)]
            del counts[hid]
            self._delta -= alloc.pop(hid)[1]
            if cz:
                if words[OUT0]:
                    zero._size[va] = size
                    zero._sorted = None
            elif zero is not None:
                zero.put(va, size)
            return None
        unmapped = words[J_DONE] if stage == S_UNMAP else n
        for va, _ in targets[:unmapped] if unmapped < n else targets:
            hid = dict.pop(mappings, va)[1]  # MapTable's del, inlined
            del starts[bisect_left(starts, va)]
            del counts[hid]  # it mapped this target alone
        if stage == S_UNMAP:
            if zero is not None:
                self._fast_zeros_back(targets[:unmapped], cz)
            err = fast.error(stage)
            err.partial = unmapped
            raise err
        released = words[J_RELEASED] if stage == S_RELEASE else n
        for hid in handles[:released] if released < n else handles:
            self._delta -= alloc.pop(hid)[1]
        failed: DeviceError | None = None
        if stage == S_RELEASE:
            failed = fast.error(stage)
            failed.partial = released
        if zero is not None:
            self._fast_zeros_back(targets, cz)
        return failed

    def _pack_unmap_release(self, targets: tuple, handles: list[int]) -> Any:
        """Write an unmap_release job into the C buffer: whether the zero pieces go back from C,
        or PYTHON when a target is not the simple case the C call takes."""
        fast = self._fast
        _, _, _, _, _, zero, alloc, mappings, _, counts, _ = self._hot
        n = len(targets)
        if n != len(handles):
            return PYTHON
        if n > fast.capacity:
            fast.ensure(n)
        _, _, _, words, raw = fast.hot
        zget = zero.handles.get if zero is not None and zero.access is not None else None
        zmax = zero.max_exact if zget is not None else 0
        cz = zget is not None  # the zeros go back from C
        get = mappings.get
        prev, off, i = -1, 8 * HEAD, HEAD + T_WORDS * n  # the handles follow the targets
        for (va, size), hid in zip(targets, handles, strict=True):
            m = get(va)
            if (m is None or m[0] != size or va <= prev or m[1] != hid or counts[hid] != 1
                    or hid not in alloc):
                return PYTHON
            prev = va
            zh = 0
            if cz:
                h = zget(size) if size <= zmax else None
                if h is None:
                    cz = False
                else:
                    zh = int(h)
            TARGET.pack_into(raw, off, va, size, zh)
            off += 32
            words[i] = hid
            i += 1
        if cz:
            words[J_ZDESC] = fast.descs[id(zero._desc)]
        elif zget is not None:  # some target has no zero handle yet: every put in Python
            for k in range(n):
                words[HEAD + T_WORDS * k + 2] = 0
        words[J_N] = words[J_M] = n
        return cz

    def _fast_zeros_back(self, targets: tuple, from_c: bool) -> None:
        """The zero pieces' table after the C call put them back, or ``put`` in Python."""
        zero = self.zero
        if not from_c:
            for va, size in targets:
                zero.put(va, size)
            return
        zsize = zero._size
        out = self._fast.words[OUT0:OUT0 + T_WORDS * len(targets):T_WORDS]
        for (va, size), ok in zip(targets, out, strict=True):
            if ok:
                zsize[va] = size
                zero._sorted = None
