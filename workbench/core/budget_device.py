"""A device that charges every physical allocation to its GPU's shared budget.

:class:`BudgetedDevice` wraps a device (host or CUDA) the way :class:`FaultyDevice` does: each
``create`` first takes its bytes from the GPU's :class:`SharedBudget`, each ``release`` gives them
back. A ``create`` the budget refuses raises :class:`DeviceError` before the inner device is
touched, exactly like a driver out of memory, so the core's all-or-nothing map undoes the page
and the page allocator answers None: a miss, never a crash, never a partial map. Because it sits
below the page allocator, every elastic pool on the device (vLLM's, SGLang's, the mini engine's)
is charged without code of its own. ``mem_info`` reports the budget as the device (total = the
budget, free = what is left of it, never more than the device has free), so a pool's headroom
check and an engine's free-memory probe see the budget too.

An engine that admits work on the headroom it sees (SGLang) takes its charge at admission:
:meth:`BudgetedDevice.prepay` charges the bytes of the pages the admitted work will map, so no
other process can take that headroom before the allocation; the pages' ``create`` draws from
what was prepaid, a page released meanwhile (the engine evicting for it) keeps its charge for it,
and :meth:`~BudgetedDevice.refund` credits what the allocation left.

A device whose class batches a page id's calls (``CudaDevice``) gets :class:`BudgetedBatchDevice`,
which charges a page id once and keeps the C fast path.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from workbench.core.budget_segment import SharedBudget
from workbench.core.device import Device, DeviceWrapper, MemInfo
from workbench.errors import ConfigError, DeviceError
from workbench.units import GiB, align_down

BATCH_CALLS = ("map_targets", "unmap_targets", "release_handles", "unmap_release")


def device_identity(device: Any) -> str:
    """The name of ``device``'s budget: one per physical GPU, the same in every process.

    A device may say it (``budget_identity``, e.g. a GPU's UUID, which survives a different
    ``CUDA_VISIBLE_DEVICES``); otherwise its name up to the first space (``host``, ``cuda:0``),
    with characters a file name must not carry replaced."""
    ident = getattr(device, "budget_identity", None) or str(device.name).split(" ")[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", ident)[:64].strip(".") or "device"


def split_evenly(total: int, instances: int, granularity: int) -> int:
    """Each static instance's share of ``total``: the same memory the elastic pools share,
    split evenly and rounded down to whole pages, so the two modes compare like for like."""
    if instances <= 0:
        raise ValueError("instances must be positive")
    return align_down(total // instances, granularity)


def instance_capacity(device: Device, instances: int) -> int:
    """A static instance's KV capacity on ``device`` when ``instances`` share it: its total
    memory (the budget, on a budgeted device) split evenly. What a lab's static baseline asks,
    so that it gets the memory the elastic pools share."""
    return split_evenly(device.mem_info().total, instances, device.granularity)


class BudgetedDevice(DeviceWrapper):
    """``inner`` with every ``create`` charged to ``budget`` and every ``release`` credited."""

    def __init__(self, inner: Device, budget: SharedBudget):
        super().__init__(inner)
        self.budget = budget
        self.sizes: dict[int, int] = {}  # live handle -> bytes charged for it
        self.prepaid = 0  # bytes charged at admission that no page backs yet
        self.admitting = False  # an admission holds: a page released keeps its charge for it

    def prepay(self, nbytes: int) -> bool:
        """Hold ``nbytes`` prepaid for pages about to be mapped: charge what is missing (all or
        nothing; False, the hold unchanged, if the budget has not that much left) or credit
        back what is over. Topping up never gives back what an earlier admission holds."""
        more = max(0, nbytes) - self.prepaid
        if more > 0 and not self.budget.charge(more):
            return False
        if more < 0:
            self.budget.credit(-more)
        self.prepaid += more
        self.admitting = True
        return True

    def refund(self) -> int:
        """Credit back what was prepaid and not used; returns the bytes credited."""
        left, self.prepaid, self.admitting = self.prepaid, 0, False
        if left:
            self.budget.credit(left)
        return left

    def _take(self, size: int) -> bool:
        """Charge ``size`` for a page being created: from the prepaid bytes first."""
        prepaid = min(self.prepaid, size)
        if size > prepaid and not self.budget.charge(size - prepaid):
            return False
        self.prepaid -= prepaid
        return True

    def _refuse(self, size: int) -> DeviceError:
        return DeviceError("create", f"out of the GPU budget ({self.budget.path.name}): "
                                     f"{size} more bytes would pass its total")

    # -- the calls the budget changes ---------------------------------------------------------
    def create(self, size: int) -> int:
        if not self._take(size):
            raise self._refuse(size)
        try:
            handle = self.inner.create(size)
        except BaseException:
            self.budget.credit(size)
            raise
        self.sizes[handle] = size
        return handle

    def _give_back(self, nbytes: int) -> None:
        """A released page's bytes: credited, or kept for the admission that holds (the pages
        an engine evicts for an admitted allocation are that allocation's, not another's)."""
        if self.admitting:
            self.prepaid += nbytes
        elif nbytes:
            self.budget.credit(nbytes)

    def release(self, handle: int) -> None:
        self.inner.release(handle)
        self._give_back(self.sizes.pop(handle, 0))

    def mem_info(self) -> MemInfo:
        free, total = self.inner.mem_info()
        budget, held = self.budget.totals()  # what this process prepaid is its own to map
        return MemInfo(max(0, min(free, budget - held + self.prepaid)), min(total, budget))

    def __repr__(self) -> str:
        return f"BudgetedDevice({self.inner!r}, {self.budget.path.name})"


class BudgetedBatchDevice(BudgetedDevice):
    """A budgeted device over one whose class batches a page id's calls: one charge per page
    id, the inner device's batch (its C fast path) for the calls."""

    def map_targets(self, targets) -> list[int]:
        targets = list(targets)
        want = sum(size for _, size in targets)
        if not self._take(want):
            raise self._refuse(want)
        try:
            handles = self.inner.map_targets(targets)
        except DeviceError as err:  # handles created so far stay charged: the undo releases them
            created = getattr(err, "partial", ([], 0))[0]
            kept = self._note(created, targets)
            self.budget.credit(want - kept)
            raise
        except BaseException:
            self.budget.credit(want)
            raise
        self._note(handles, targets)
        return handles

    def _note(self, handles: list[int], targets: list) -> int:
        kept = 0
        for h, (_, size) in zip(handles, targets, strict=False):
            self.sizes[h] = size
            kept += size
        return kept

    def _credit(self, handles) -> None:
        self._give_back(sum(self.sizes.pop(h, 0) for h in handles))

    def unmap_targets(self, targets) -> None:
        self.inner.unmap_targets(targets)

    def release_handles(self, handles) -> None:
        handles = list(handles)
        try:
            self.inner.release_handles(handles)
        except DeviceError as err:
            self._credit(handles[:getattr(err, "partial", 0)])
            raise
        self._credit(handles)

    def unmap_release(self, targets, handles):
        handles = list(handles)
        failed = self.inner.unmap_release(targets, handles)  # an unmap failure releases nothing
        self._credit(handles if failed is None else handles[:getattr(failed, "partial", 0)])
        return failed


def budgeted(device: Device, total: int, **open_kw: Any) -> BudgetedDevice:
    """``device`` charged to its GPU's budget of ``total`` bytes (created if none exists yet);
    a budget file that is not one this workbench trusts is refused in one ConfigError line."""
    budget = SharedBudget.open(device_identity(device), total, **open_kw)
    assert budget is not None  # a total was given: open creates the file when it is missing
    cls = BudgetedBatchDevice if all(hasattr(type(device), m) for m in BATCH_CALLS) \
        else BudgetedDevice
    return cls(device, budget)


class BudgetDevice:
    """A device shared by several pools whose physical bytes together may not pass ``budget``.

    ``create``/``release``/``mem_info`` keep the budget; every VMM call (create, map, set_access,
    unmap, release) is counted and timed in ``calls`` under the thread that made it: ``engine``
    (the request path) or ``mapper`` (a background mapper thread, named ``*-mapper``). ``refused``
    counts creates past the budget. ``mem_info`` reports the budget left, so each pool's headroom
    check sees what the others hold.
    """

    def __init__(self, inner, budget: int):
        if budget <= 0 or budget % inner.granularity:
            raise ConfigError(f"budget {budget}", "it must be a positive multiple of the "
                              f"device's granularity ({inner.granularity} bytes)",
                              "round the budget to whole pages")
        self.inner = inner
        self.budget = budget
        self.name = f"{inner.name} (budget {budget / GiB:.2f} GiB)"
        self.used = 0
        self.peak = 0
        self.refused = 0
        self._sizes: dict[int, int] = {}
        # thread -> op -> [calls, seconds in the call, seconds waiting for another thread's call]
        self.calls: dict[str, dict[str, list[float]]] = {}
        # one call at a time: the pools' mappers and the engine thread share this device
        self._lock = threading.RLock()

    def _timed(self, op: str, fn, *args):
        t = time.perf_counter()
        with self._lock:
            t1 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                who = "mapper" if threading.current_thread().name.endswith("-mapper") \
                    else "engine"
                c = self.calls.setdefault(who, {}).setdefault(op, [0, 0.0, 0.0])
                c[0] += 1
                c[1] += time.perf_counter() - t1
                c[2] += t1 - t

    def create(self, size: int) -> int:
        return self._timed("create", self._create, size)

    def _create(self, size: int) -> int:  # under the lock
        if self.used + size > self.budget:
            self.refused += 1
            raise DeviceError("create", f"out of memory (the {self.budget / GiB:.2f} GiB budget "
                              "the pools share is used up)", "CUDA_ERROR_OUT_OF_MEMORY")
        h = self.inner.create(size)
        self._sizes[h] = size
        self.used += size
        self.peak = max(self.peak, self.used)
        return h

    def map(self, va: int, size: int, handle: int) -> None:
        self._timed("map", self.inner.map, va, size, handle)

    def set_access(self, va: int, size: int) -> None:
        self._timed("set_access", self.inner.set_access, va, size)

    def unmap(self, va: int, size: int) -> None:
        self._timed("unmap", self.inner.unmap, va, size)

    def release(self, handle: int) -> None:
        self._timed("release", self._release, handle)

    def _release(self, handle: int) -> None:  # under the lock
        self.inner.release(handle)
        self.used -= self._sizes.pop(handle)

    def mem_info(self) -> MemInfo:
        return MemInfo(min(self.inner.mem_info().free, self.budget - self.used), self.budget)

    def take_counts(self) -> dict:
        """The call counts since the last take (then cleared), and the refusals."""
        out = {"calls": self.calls, "refused_creates": self.refused, "peak_bytes": self.peak}
        self.calls, self.refused, self.peak = {}, 0, self.used
        return out

    def __getattr__(self, item: str):
        return getattr(self.inner, item)
