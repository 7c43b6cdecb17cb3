"""A background mapper: a thread keeps a pool's reserve filled, off the engine's request path.

Without it, an ``alloc`` that drops the reserve below ``min_reserved`` refills it on the spot, so
the request that took a page also pays for mapping the next one. Here the allocation only
*signals* (the page allocator's ``refill_hook``) and a daemon thread maps the pages, as kvcached's
preallocation thread does; the engine thread takes pages that are already mapped.

Why it is thread safe:

1. **One lock over all pool state.** :class:`LockedKVCacheManager` takes one re-entrant lock
   around every public call that reads or changes the ledger, the page allocator or the device
   (alloc, free, limits, trim, snapshots, close); the mapper maps only while holding the same
   lock. Every device call therefore runs under it, one thread at a time, whichever thread.
2. **One page per turn.** The mapper takes the lock for a single page's map and drops it between
   pages, so an engine call waits at most one page map, never a whole refill.
3. **The hook only notes.** ``refill_hook`` runs inside the engine's ``alloc`` (lock held) and
   only sets a flag; the alloc wakes the thread after releasing the lock (``after_unlock``), so
   no lock is taken the other way round (no deadlock) and the thread never wakes just to wait
   on a lock the engine holds. A wake-up is never lost: the thread re-checks the reserve under
   the lock after every wake.
4. **The mapper only adds.** It moves FREE pages to RESERVED (mapping fresh ranges nobody
   reads); it never unmaps a page in use, and a page it mapped is visible to the engine only
   once it is on the reserve list, under the lock. Kernels reading IN_USE pages meanwhile touch
   other address ranges (CUDA VMM allows mapping while other ranges are in use).
5. **Orderly stop.** :meth:`BackgroundMapper.stop` sets a flag, wakes the thread and joins it
   before the pool is closed. A mapper error (a failed pool) stops the thread and is kept in
   ``error``; the pool itself refuses further work as it would without a mapper.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from workbench.core.ledger import KVCacheManager
from workbench.core.pages import PageAllocator


class LockedKVCacheManager(KVCacheManager):
    """A :class:`KVCacheManager` whose public calls hold ``self.lock`` (a re-entrant lock)."""

    def __init__(self, *args, **kw):
        self.lock = threading.RLock()
        self.after_unlock: Callable[[], None] | None = None  # runs once an alloc let go
        with self.lock:
            super().__init__(*args, **kw)

    def alloc(self, n: int) -> list[int] | None:
        with self.lock:
            out = super().alloc(n)
        if self.after_unlock is not None:
            self.after_unlock()
        return out

    def free(self, ids: Iterable[int]) -> None:
        with self.lock:
            super().free(ids)

    def available_size(self) -> int:
        with self.lock:
            return super().available_size()

    def try_to_reserve(self, n: int) -> bool:
        with self.lock:
            out = super().try_to_reserve(n)
        if self.after_unlock is not None:
            self.after_unlock()
        return out

    def free_reserved(self) -> None:
        with self.lock:
            super().free_reserved()

    def set_limit(self, limit: int, revision: int | None = None):
        with self.lock:
            return super().set_limit(limit, revision)

    def trim(self) -> int:
        with self.lock:
            return super().trim()

    def capture_marker(self) -> int:
        with self.lock:
            return super().capture_marker()

    def release_retired_through(self, marker: int) -> int:
        with self.lock:
            return super().release_retired_through(marker)

    def poll_control(self) -> None:
        with self.lock:
            super().poll_control()

    def snapshot(self, with_pages: bool = True):
        with self.lock:
            return super().snapshot(with_pages)

    def check_invariants(self) -> None:
        with self.lock:
            super().check_invariants()

    def close(self) -> list[str]:
        with self.lock:
            return super().close()


class BackgroundMapper:
    """Refills ``manager``'s reserve to ``min_reserved`` from a daemon thread, one page per lock
    turn. ``maps_on_thread`` counts the pages it mapped; ``error`` holds what stopped it."""

    def __init__(self, manager: LockedKVCacheManager, *, name: str = "kv-mapper"):
        self.manager = manager
        self.pages: PageAllocator = manager.pages
        self.lock = manager.lock
        self.maps_on_thread = 0
        self.error: BaseException | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._due = False
        self._idle = threading.Event()  # set while the thread waits for work
        # inside alloc (lock held) only note that a refill is due; wake the thread once the
        # alloc has let go of the lock, so the thread never wakes just to block on it
        self.pages.refill_hook = self._note_due
        manager.after_unlock = self._wake_if_due
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.signal()  # fill the reserve once at start

    def signal(self) -> None:
        self._wake.set()

    def _note_due(self) -> None:
        self._due = True

    def _wake_if_due(self) -> None:
        if self._due:
            self._due = False
            self._wake.set()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _one_page(self) -> bool:
        """Map one page into the reserve if it is short; False when there is nothing to do."""
        with self.lock:
            p = self.pages
            if self._stop.is_set() or p.failed or self.manager.closed:
                return False
            if len(p.reserved) >= p.min_reserved:
                return False
            want, p.min_reserved = p.min_reserved, len(p.reserved) + 1
            try:
                got = p.refill()
            finally:
                p.min_reserved = want
        self.maps_on_thread += got
        return got > 0

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._idle.set()
                self._wake.wait()
                self._idle.clear()
                self._wake.clear()
                while self._one_page():
                    pass
        except BaseException as err:  # noqa: BLE001 - kept for the owner; the pool has failed
            self.error = err

    def wait_filled(self, timeout: float = 5.0) -> bool:
        """Block until the reserve is at ``min_reserved`` (or no more pages can be mapped) and the
        thread is idle again (so a request timed next does not race its last check)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                p = self.pages
                done = len(p.reserved) >= p.min_reserved or not p.new_pages_possible()
            if done and (self._idle.wait(0.001) or not self.running) and not self._wake.is_set():
                return True
            time.sleep(0.0002)
        return False

    def stop(self) -> None:
        """Stop and join the thread; the pool goes back to refilling inline."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        with self.lock:
            if self.pages.refill_hook == self._note_due:
                self.pages.refill_hook = None
            self.manager.after_unlock = None
