"""One engine interface for every engine the labs drive (seed 001 §2, §5).

An :class:`Engine` is one serving instance over one KV pool. The kinds that implement it are
named in one registry, :mod:`workbench.engines.kinds`:

* ``sim-vllm`` and ``sim-sglang`` (:mod:`workbench.engines.sim`): the pure schedulers of
  :mod:`workbench.engines.sched` driven by SimPy against simulated time on a ``SimDevice``;
* ``mini`` (:class:`workbench.mini.instance.MiniInstance`): the same vLLM-like scheduler driving
  a real model whose KV lives in a pool on a host or CUDA device, against the wall clock;
* ``vllm`` and ``sglang`` on ``host``/``gpu`` (:class:`~workbench.engines.real.server.ServerEngine`
  and its subclasses): a real engine server in its own process, elastic through the adapters or
  stock; ``submit`` streams requests to the server, ``advance`` waits, ``metrics`` summarises the
  client's timings and ``memory_timeline`` samples the pool's control segment (``kvtop``'s
  reader). Its ``kv_pool`` is a read-only :class:`PoolView` of that segment.

Clocks: an engine's clock is the simulated ``env.now`` (every instance on one simulated GPU shares
it, so advancing one advances all) or the wall clock since the instance's ``t0``. Request
``arrival`` times are on that clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from workbench.core.ledger import KVCacheManager
    from workbench.engines.metrics import SLO, MemorySample, Summary
    from workbench.engines.sched.request import Request


@runtime_checkable
class PoolView(Protocol):
    """What labs read of an instance's KV pool. An in-process kind's ``KVCacheManager`` is one;
    an engine in another process gives a read-only view of its control segment."""

    @property
    def capacity_bytes(self) -> int: ...

    @property
    def mapped_bytes(self) -> int: ...

    @property
    def used_blocks(self) -> int: ...


@runtime_checkable
class Engine(Protocol):
    """What a lab needs from a serving instance."""

    name: str
    kind: str

    def submit(self, requests: Iterable[Request]) -> None:
        """Queue ``requests``; each enters the scheduler at its ``arrival`` (engine clock)."""

    def advance(self, until: float | None = None) -> None:
        """Run until the engine clock reaches ``until`` (None: until all submitted work is
        done). A wall-clock engine asked for a time already past runs at most one step."""

    def has_work(self) -> bool:
        """Requests submitted and not yet finished (queued, waiting or running)."""

    def metrics(self, slo: SLO | None = None) -> Summary:
        """Latency, throughput and goodput over every request submitted so far."""

    def memory_timeline(self) -> list[MemorySample]:
        """The pool's samples (mapped, reserved bytes, used blocks) taken while running."""

    @property
    def kv_pool(self) -> KVCacheManager | PoolView:
        """The KV pool this instance allocates from: the ledger itself in process (simulated
        and mini kinds), a :class:`PoolView` of the engine's control segment otherwise."""
