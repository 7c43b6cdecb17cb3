"""A pool's virtual KV range and how a page id is backed: layout, offsets, map/unmap, rollback.

Byte layout (``base`` is the reservation's start; ``bb`` block bytes, ``L`` layers, ``B`` buffers,
``P`` page size, ``NP`` number of pages):

* CONTIGUOUS: block ``b`` of layer ``l`` buffer ``k`` lives at ``b*bb*L*B + (l*B + k)*bb``. Blocks
  interleave every layer and buffer, so each layer's view has a uniform block stride ``bb*L*B`` and
  page id ``p`` is the single compound range ``[p*P*L*B, (p+1)*P*L*B)``: one map.
* PER_LAYER: layer ``l`` buffer ``k`` is the region ``(l*B + k)*NP*P``; block ``b`` lives at
  ``region + b*bb``; page id ``p`` is ``L*B`` ranges of ``P`` bytes: ``L*B`` maps.

A page is backed all-or-nothing: if any call fails, what this call created or mapped is undone in
reverse; if the undo fails too, :class:`MapQuarantinedError` tells the caller to quarantine it.
Unmapping is two-phase (prepare retains the physical handles, commit releases them, abort remaps
them) so a coordinator can make it a transaction across workers.
"""

from __future__ import annotations

from typing import NamedTuple

from workbench.core.device import Device
from workbench.core.geometry import KVGeometry, Layout
from workbench.errors import DeviceError, MapQuarantinedError, StateConsistencyError


class Target(NamedTuple):
    va: int
    size: int


class ViewSpec(NamedTuple):
    """Where one layer's buffer lives: byte offset of block 0 and the byte stride between blocks."""

    offset: int
    block_stride: int


class KVSpace:
    """One pool's virtual reservation on one device, and the physical handles behind its pages."""

    def __init__(self, geometry: KVGeometry, device: Device):
        geometry.check_granularity(device.granularity)
        self.geometry = geometry
        self.device = device
        self.size = geometry.virtual_bytes
        self.base = device.reserve(self.size)
        self.handles: dict[int, list[int]] = {}  # page -> one handle per target (mapped)
        self.retained: dict[int, list[int]] = {}  # page -> handles unmapped but not released
        # page -> (targets maybe still mapped, handles maybe still live) after a failed undo;
        # close() cleans them up best effort
        self.stranded: dict[int, tuple[list[Target], list[int]]] = {}
        # page -> its targets, built on first use: every map and unmap of a page needs them, and
        # they never change while the reservation lives (close() drops them with ``base``)
        self._targets: dict[int, tuple[Target, ...]] = {}
        # A device whose *class* batches a page id's calls (CudaDevice) gets one Python call per
        # page id, not three per target; a wrapper (FaultyDevice, a coordinator) never does, so
        # fault injection still sees every call.
        cls = type(device)
        batched = all(hasattr(cls, m) for m in ("map_targets", "unmap_targets",
                                                "release_handles"))
        self._batch = device if batched else None
        # pages whose handles prepare_unmap(release_next=True) already released through the
        # batched device, with the release's failure (None: released) for commit_unmap to raise
        self._released: dict[int, DeviceError | None] = {}

    # -- layout ------------------------------------------------------------------------------
    def targets(self, page: int) -> list[Target]:
        return list(self._page_targets(page))

    def _page_targets(self, page: int) -> tuple[Target, ...]:
        ts = self._targets.get(page)
        if ts is None:
            ts = self._targets[page] = tuple(self._layout_targets(page))
        return ts

    def _layout_targets(self, page: int) -> list[Target]:
        g = self.geometry
        if g.layout is Layout.CONTIGUOUS:
            return [Target(self.base + page * g.page_id_bytes, g.page_id_bytes)]
        region = g.num_pages * g.page_size
        return [Target(self.base + i * region + page * g.page_size, g.page_size)
                for i in range(g.num_layers * g.num_buffers)]

    def view(self, layer: int, buffer: int) -> ViewSpec:
        g = self.geometry
        i = layer * g.num_buffers + buffer
        if g.layout is Layout.CONTIGUOUS:
            return ViewSpec(i * g.block_bytes, g.block_bytes * g.num_layers * g.num_buffers)
        return ViewSpec(i * g.num_pages * g.page_size, g.block_bytes)

    def block_address(self, layer: int, buffer: int, block: int) -> int:
        v = self.view(layer, buffer)
        return self.base + v.offset + block * v.block_stride

    def is_mapped(self, page: int) -> bool:
        return page in self.handles

    # -- backing -----------------------------------------------------------------------------
    def map_page(self, page: int) -> None:
        """Back every target of ``page`` or none. Raises DeviceError (undone) or
        MapQuarantinedError (undo failed: the page's backing is unknown)."""
        if page in self.handles or page in self.retained:
            raise StateConsistencyError(f"page {page} is already backed")
        targets = self._targets.get(page) or self._page_targets(page)
        if self._batch is not None:
            try:
                self.handles[page] = self._batch.map_targets(targets)
            except DeviceError as err:  # the state the separate calls would have left
                created, n = getattr(err, "partial", ([], 0))
                self._undo_map(page, err, list(targets[:n]), created)
                raise
            return
        dev = self.device
        created: list[int] = []
        mapped: list[Target] = []
        try:
            for t in targets:
                va, size = t
                created.append(dev.create(size))
                dev.map(va, size, created[-1])
                mapped.append(t)
                dev.set_access(va, size)
        except DeviceError as err:
            self._undo_map(page, err, mapped, created)
            raise
        self.handles[page] = created

    def _undo_map(self, page: int, err: DeviceError, mapped: list[Target],
                  created: list[int]) -> None:
        """Undo a failed :meth:`map_page` in reverse; MapQuarantinedError if the undo fails."""
        dev = self.device
        try:
            while mapped:
                dev.unmap(mapped[-1].va, mapped[-1].size)
                mapped.pop()
            while created:
                dev.release(created[-1])
                created.pop()
        except DeviceError as undo:
            self.stranded[page] = (mapped, created)
            raise MapQuarantinedError(
                f"page {page}: {err}; rollback failed too ({undo})") from undo

    def prepare_unmap(self, page: int, *, release_next: bool = False) -> None:
        """Unmap ``page`` everywhere but keep its physical handles (phase one).

        ``release_next``: the caller commits at once (and never aborts), so a batched device
        unmaps and releases in one call, in the bare driver's order (unmap, release, then the
        zero page); a release failure is kept for :meth:`commit_unmap` to raise."""
        handles = self.handles.pop(page)
        dev = self.device
        targets = self._targets.get(page) or self._page_targets(page)
        done: list[tuple[Target, int]] = []
        try:
            if self._batch is not None:
                try:
                    if release_next:
                        self._released[page] = self._batch.unmap_release(targets, handles)
                    else:
                        self._batch.unmap_targets(targets)
                except DeviceError as err:
                    n = getattr(err, "partial", 0)
                    done = list(zip(targets[:n], handles[:n], strict=True))
                    raise
            else:
                for t, h in zip(targets, handles, strict=True):
                    dev.unmap(t.va, t.size)
                    done.append((t, h))
        except DeviceError:
            try:  # put back what this call unmapped, so the page is whole again
                for t, h in reversed(done):
                    self.device.map(t.va, t.size, h)
                    self.device.set_access(t.va, t.size)
            except DeviceError as undo:
                self.stranded[page] = (self.targets(page), handles)
                raise StateConsistencyError(
                    f"page {page}: unmap failed and the remap failed too ({undo})") from undo
            self.handles[page] = handles
            raise
        self.retained[page] = handles

    def commit_unmap(self, page: int) -> None:
        """Release the retained handles of ``page`` (phase two). Idempotent."""
        handles = self.retained.pop(page, None)
        if handles is None:
            return
        if page in self._released:  # released by prepare_unmap(release_next=True)
            err = self._released.pop(page)
            if err is not None:
                self.retained[page] = handles[getattr(err, "partial", 0):]
                raise StateConsistencyError(f"page {page}: release failed ({err})") from err
            return
        if self._batch is not None:
            try:
                self._batch.release_handles(handles)
            except DeviceError as err:
                self.retained[page] = handles[getattr(err, "partial", 0):]
                raise StateConsistencyError(f"page {page}: release failed ({err})") from err
            return
        release = self.device.release
        for i, h in enumerate(handles):
            try:
                release(h)
            except DeviceError as err:
                self.retained[page] = handles[i:]
                raise StateConsistencyError(f"page {page}: release failed ({err})") from err

    def abort_unmap(self, page: int) -> None:
        """Remap ``page`` from its retained handles (undo phase one)."""
        if page in self._released:
            raise StateConsistencyError(f"page {page}: its handles are released; no abort")
        handles = self.retained.pop(page)
        try:
            for t, h in zip(self.targets(page), handles, strict=True):
                self.device.map(t.va, t.size, h)
                self.device.set_access(t.va, t.size)
        except DeviceError as err:
            raise StateConsistencyError(f"page {page}: abort could not remap ({err})") from err
        self.handles[page] = handles

    def unmap_page(self, page: int) -> None:
        """Prepare and commit in one step (a single target needs no transaction)."""
        self.prepare_unmap(page)
        self.commit_unmap(page)

    def close(self) -> list[str]:
        """Unmap everything and give the reservation back, best effort: a failing call is noted
        and the rest goes on. Returns what could not be undone (empty when all went well)."""
        problems: list[str] = []
        if self.base is None:
            return problems
        dev = self.device
        for page in sorted(self.handles):
            for t in self.targets(page):
                _try(problems, dev.unmap, t.va, t.size)
            self.retained[page] = self.handles.pop(page)
        for page, (targets, handles) in self.stranded.items():
            for t in targets:  # some of these may already be unmapped: that is no problem
                _try(problems, dev.unmap, t.va, t.size, quiet=True)
            self.retained.setdefault(page, []).extend(handles)
        self.stranded.clear()
        self._released.clear()
        for handles in self.retained.values():
            for h in handles:
                _try(problems, dev.release, h)
        self.retained.clear()
        _try(problems, dev.unreserve, self.base, self.size)
        self.base = None
        self._targets.clear()
        return problems


def _try(problems: list[str], fn, *args, quiet: bool = False) -> None:
    try:
        fn(*args)
    except DeviceError as err:
        if not quiet:
            problems.append(str(err))
