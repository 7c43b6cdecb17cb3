"""Background preallocation as a SimPy process: refills a pool's reserve off the request path.

An allocation that drains the reserve below ``min_reserved`` only *signals*; this process then maps
pages one at a time, each taking the device's map latency in simulated time, so the cost of mapping
moves off the allocating request — the point of keeping reserved pages.
"""

from __future__ import annotations

import simpy

from workbench.core.ledger import KVCacheManager


class PreallocProcess:
    def __init__(self, env: simpy.Environment, pool: KVCacheManager):
        self.env = env
        self.pool = pool
        self.device = pool.device
        self._wake = env.event()
        self.pages_mapped = 0
        pool.pages.refill_hook = self.signal
        self.process = env.process(self._run())

    def signal(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def _run(self):
        pages = self.pool.pages
        while True:
            yield self._wake
            self._wake = self.env.event()
            while len(pages.reserved) < pages.min_reserved and not pages.failed:
                before = self.device.busy_s
                # one page at a time so allocations can interleave with the refill
                min_reserved, pages.min_reserved = pages.min_reserved, len(pages.reserved) + 1
                try:
                    got = pages.refill()
                finally:
                    pages.min_reserved = min_reserved
                self.pool._publish()  # the segment shows the page now, not at the next alloc
                yield self.env.timeout(self.device.busy_s - before)
                if not got:
                    break
                self.pages_mapped += got
