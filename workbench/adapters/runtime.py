"""What every engine adapter shares: config, ledgers, fences.

* The device an engine's pools share is :func:`workbench.backends.shared_device`'s (one per GPU
  per process).
* :func:`make_ledger` builds a :class:`~workbench.core.ledger.KVCacheManager` from
  ``WORKBENCH_KV_*`` (its control segment is published when ``WORKBENCH_KV_IPC_NAME`` is set,
  so ``workbench kvctl list`` shows the engine). On a device with queued work the ledger
  defers releases and gets a :class:`ReleaseFence`: a page whose last block is freed is
  unmapped only once the GPU has passed the work queued before the free (kernels that may still
  touch it).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from workbench.config import PoolConfig
from workbench.core.device import Device
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager

_ids = itertools.count()
ledgers: list[KVCacheManager] = []  # every pool this process built (doctor, tests)
streams: list[Any] = []  # extra CUDA streams whose queued work a fence must wait for


def pool_config(**overrides) -> PoolConfig:
    return PoolConfig.from_env(**overrides)


def make_ledger(geometry: KVGeometry, device: Device, prefix: str,
                config: PoolConfig) -> KVCacheManager:
    """A ledger named ``<prefix>-<n>``; on a device with queued work (CUDA) it defers releases
    behind a fence (``ledger.fence``), on the host it releases at once (``ledger.fence`` is
    None)."""
    queued = device.queued_work
    kv = KVCacheManager(geometry, device, name=f"{prefix}-{next(_ids)}", config=config,
                        defer_release=queued)
    kv.fence = ReleaseFence(kv) if queued else None
    ledgers.append(kv)
    return kv


def watch_stream(stream: Any) -> None:
    """Fences also wait for work queued on ``stream`` (an engine's forward or side stream)."""
    if stream is not None and all(s is not stream for s in streams):
        streams.append(stream)


@dataclass(slots=True)
class ReleaseFence:
    """Unmap a retired page only after the GPU finished what was queued before its free.

    ``after_free()`` closes the ledger's epoch and records a CUDA event on the current stream
    and every :data:`streams` entry; ``poll()`` releases the epochs whose events all completed
    (never blocking); ``drain()`` waits for every event first (a miss: memory is about to be
    refused, so waiting for in-flight kernels is cheaper than failing). Inside a CUDA graph
    capture nothing is recorded or queried: the pages stay retired until the next poll after it.
    """

    ledger: KVCacheManager
    pending: list[tuple[int, list[Any]]] = field(default_factory=list)  # (marker, events)

    def _capturing(self) -> bool:
        import torch

        return torch.cuda.is_current_stream_capturing()

    def after_free(self) -> None:
        pages = self.ledger.pages
        if not pages.retired or self._capturing():
            return
        if self.pending and all(e <= self.pending[-1][0] for e in pages.retired.values()):
            return  # nothing retired since the last marker
        import torch

        marker = self.ledger.capture_marker()
        events = []
        for stream in [torch.cuda.current_stream(), *streams]:
            ev = torch.cuda.Event()
            ev.record(stream)
            events.append(ev)
        self.pending.append((marker, events))

    def poll(self) -> int:
        """Release every epoch whose events completed; returns pages released."""
        if not self.pending or self._capturing():
            return 0
        done = None
        while self.pending and all(ev.query() for ev in self.pending[0][1]):
            done = self.pending.pop(0)[0]
        return 0 if done is None else self.ledger.release_retired_through(done)

    def drain(self) -> int:
        """Wait for every pending event, then release what they cover."""
        if not self.pending or self._capturing():
            return 0
        for ev in self.pending[-1][1]:
            ev.synchronize()
        for _, events in self.pending[:-1]:
            for ev in events:
                ev.synchronize()
        return self.poll()
