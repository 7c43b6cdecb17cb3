"""One TP x PP worker set behind one interface, for the tp-pp and faults labs.

``sim`` is :class:`~workbench.sim.workers.SimCluster` (SimPy workers, simulated time); ``host``
and ``gpu`` are :class:`~workbench.transport.WorkerGroup` (one OS process per rank over Unix
sockets; host memory, or one CUDA GPU per rank). Every coordinator message goes through a
:class:`~workbench.viz.sequence.RecordingTransport`, so the sequence diagrams draw what was
really sent. Faults are armed the way each transport allows: a failing driver call, a reply that
is never sent, a dead worker (``SimCluster.crash`` / a real SIGKILL).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

from workbench.backends import capabilities, cuda_device_count
from workbench.config import PoolConfig
from workbench.core.coordinator import FanOutSpace, WorkerId, targets_for
from workbench.core.events import EventLog
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError, WorkbenchError
from workbench.viz.sequence import Message, RecordingTransport

# 2 layers x K/V, 2 MiB pages: a page id is 8 MiB on every rank and holds 512 blocks; 16 ids.
GEO = KVGeometry(num_layers=2, kv_heads=2, head_dim=64, block_size=16, num_blocks=8192)
BPP = GEO.page_size // GEO.block_bytes
SIM_TIMEOUT = 0.01  # simulated seconds: a message costs ~20 us, a device call ~100 us
REAL_TIMEOUT = 30.0  # wall seconds; no case here waits for it (a lost reply ends its connection)
HOST_CAPACITY = 1 << 30  # a host worker's budget: its free figure then counts only its own pages
BARE = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=0)


def need_gpus(lab: str, backend: str, ranks: int, gpus: int | None = None) -> None:
    """One rank per GPU unless ``gpus`` asks for fewer (ranks then share them, rank ``i`` on
    GPU ``i mod gpus``): refuse (one line) when fewer GPUs than that are visible."""
    if gpus is not None and not 1 <= gpus <= ranks:
        raise ConfigError(f"gpus={gpus}", f"the lab runs {ranks} ranks at once",
                          f"use 1 to {ranks} GPUs, or leave gpus unset for one per rank")
    caps = capabilities(backend)
    if not caps.cuda:
        return
    n, want = cuda_device_count(), gpus or ranks
    if n < want:
        why = (f"needs one GPU per rank ({ranks} ranks)" if gpus is None
               else f"was asked to spread its ranks over {gpus} GPUs")
        raise ConfigError(f"lab {lab!r} on backend {backend!r}",
                          f"{why} and this host shows {n}",
                          "run it on a host with that many GPUs, set gpus=1 to let the ranks "
                          "share one (--param gpus=1), or use --backend host or sim")


def placement(backend: str, gpus: int | None) -> str:
    """Where the ranks run, in words, for the report and the record."""
    caps = capabilities(backend)
    if not caps.real_processes:
        return "simulated workers (SimPy, one simulated GPU each)"
    if not caps.cuda:
        return "one OS process per rank, host memory (memfd)"
    if gpus is None:
        return "one OS process per rank, one CUDA GPU per rank"
    return (f"one OS process per rank, the ranks sharing {gpus} CUDA GPU(s) (rank i on GPU "
            f"i mod {gpus}): each process maps its own pages; not the one-GPU-per-rank setup")


def shm_entries(pids: set[int]) -> list[str]:
    """Workbench entries in the shared-memory directory (control segments, half-written ones)
    owned by one of ``pids``: what a leaked segment of ours would leave. Other processes'
    entries (other users of the machine) are not counted."""
    from workbench.core import segment as seg

    out = []
    for p in sorted(seg.SHM_DIR.glob("wbkv*")):
        owner = seg.partial_owner(p.name) if p.name.startswith(seg.PARTIAL_PREFIX) else None
        pid = owner[0] if owner else None
        if pid is None:
            try:
                got = seg.read_checked(p)
            except (WorkbenchError, OSError):
                got = None
            pid = got[0]["owner_pid"] if got else None
        if pid in pids:
            out.append(p.name)
    return out


def wid(t: WorkerId) -> str:
    return f"pp{t.pp}/tp{t.tp}"


@dataclass(slots=True)
class Rig:
    """Workers for one pool; build with :func:`open_rig`, end with :meth:`close`."""

    backend: str
    tp: int
    pp: int
    transport: RecordingTransport
    cluster: Any = None  # SimCluster on sim
    group: Any = None  # WorkerGroup on host/gpu
    killed: list[WorkerId] = field(default_factory=list)

    @property
    def real(self) -> bool:
        return self.group is not None

    @property
    def timeout(self) -> float:
        return REAL_TIMEOUT if self.real else SIM_TIMEOUT

    def space(self, pp_rank: int = -1, **kw: Any) -> FanOutSpace:
        return FanOutSpace(GEO, self.transport, targets_for(self.tp, self.pp, pp_rank),
                           timeout=self.timeout, **kw)

    def pool(self, pp_rank: int = -1, *, defer_release: bool = False,
             config: PoolConfig = BARE) -> KVCacheManager:
        return KVCacheManager(GEO, space=self.space(pp_rank), config=config, events=EventLog(),
                              defer_release=defer_release)

    def states(self) -> dict[WorkerId, dict[str, Any] | None]:
        if self.real:
            return {t: (None if t in self.killed else s) for t, s in self.group.states().items()}
        return {t: s if s["alive"] else None for t, s in self.cluster.states().items()}

    def mapped(self) -> dict[str, list[int]]:
        """Pages each live rank has mapped ([] for a dead one)."""
        return {wid(t): sorted(s["mapped"]) if s else [] for t, s in self.states().items()}

    def held(self) -> dict[str, int | None]:
        """Device bytes each rank holds (None where the rank is dead: its process is gone)."""
        if not self.real:
            return {wid(t): (self.cluster.device_bytes(t) if w.alive else None)
                    for t, w in self.cluster.workers.items()}
        out: dict[str, int | None] = {}
        for t, s in self.states().items():
            if s is None:
                out[wid(t)] = None
            else:  # a GPU worker reports what it holds; a host worker has a fixed capacity
                out[wid(t)] = s["held"] if s.get("held") is not None else s["total"] - s["free"]
        return out

    # -- faults ------------------------------------------------------------------------------
    def fail_device(self, t: WorkerId, call: str) -> None:
        """The next ``call`` (create, map, set_access, unmap, release) on rank ``t`` fails."""
        if self.real:
            self.group.inject(t, device={call: 1})
        else:
            self.cluster.workers[t].device.fail_next(call, 1)

    def drop_reply(self, t: WorkerId, op: str) -> None:
        """Rank ``t`` applies its next ``op`` but its reply never arrives."""
        if self.real:
            self.group.inject(t, drop_reply=op)
        else:
            from workbench.sim.workers import Fault

            self.cluster.faults.append(Fault("drop_reply", op=op, worker=t))

    def kill(self, t: WorkerId) -> int | None:
        """Rank ``t`` dies without any cleanup (SIGKILL); returns its pid on host/gpu."""
        self.killed.append(t)
        if not self.real:
            self.cluster.crash(t)
            return None
        pid = self.group.procs[t].pid
        self.group.kill(t, signal.SIGKILL)
        return pid

    # -- messages ----------------------------------------------------------------------------
    def take(self) -> list[Message]:
        """The messages since the last call, times from the first of them (seconds)."""
        msgs, self.transport.messages = self.transport.messages, []
        t0 = msgs[0].t if msgs else 0.0
        return [m._replace(t=(m.t - t0) if m.t is not None else None) for m in msgs]

    def pids(self) -> set[int]:
        """This process and every worker process (none on sim)."""
        return {os.getpid()} | ({p.pid for p in self.group.procs.values()} if self.real
                                else set())

    def socket_files(self) -> list[str]:
        """The socket files under this pool's directory (host/gpu), relative to it."""
        if not self.real or not self.group.dir.exists():
            return []
        return sorted(str(p.relative_to(self.group.dir)) for p in self.group.dir.rglob("*.sock"))

    def close(self) -> dict[str, Any]:
        """Stop the workers; what is left behind (the socket directory, live worker pids)."""
        if not self.real:
            return {"socket_dir_left": False, "workers_left": []}
        self.group.shutdown()
        alive = [wid(t) for t, p in self.group.procs.items() if p.poll() is None]
        return {"socket_dir_left": self.group.dir.exists(), "workers_left": alive}


def open_rig(backend: str, tp: int = 1, pp: int = 1, *, name: str = "lab",
             missing: tuple[WorkerId, ...] = (), gpus: int | None = None) -> Rig:
    """Workers for ``backend``: sim (SimPy), host (processes, host memory) or gpu/cuda:N
    (processes, GPU ``i mod gpus`` for the i-th rank; ``gpus`` None: one GPU per rank), warmed
    up (see :func:`warm_up`)."""
    caps = capabilities(backend)
    if not caps.real_processes:
        from workbench.sim.workers import SimCluster

        cluster = SimCluster(GEO, tp, pp, missing=missing)
        rig = Rig(backend, tp, pp, RecordingTransport(cluster), cluster=cluster)
    else:
        from workbench.transport import WorkerGroup

        where = list(range(gpus or tp * pp)) if caps.cuda else None
        group = WorkerGroup(GEO, tp, pp, name=name, backend=caps.kind, missing=missing,
                            gpus=where, capacity=HOST_CAPACITY if caps.capacity_settable else None)
        rig = Rig(backend, tp, pp, RecordingTransport(group.transport), group=group)
    if not missing:
        try:
            warm_up(rig)
        except BaseException:
            rig.close()
            raise
    return rig


def warm_up(rig: Rig) -> None:
    """Map and unmap the last page id on every worker once. A CUDA worker keeps a zero piece
    of the page's size after its first unmap (the driver's, never given back); taking it here
    makes every later held-bytes comparison exact. Sim and host workers hold nothing after."""
    fan = rig.space()
    fan.map_page(GEO.num_pages - 1)
    fan.unmap_page(GEO.num_pages - 1)
    rig.take()
