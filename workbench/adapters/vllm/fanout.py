"""vLLM with its model runners in other processes (the ``mp`` executor, TP > 1): the scheduler
decides which pages are backed, every worker applies the decision on its own KV range.

* **worker side** (each ``VllmWorker-<rank>`` process, in ``allocate_kv_cache``): the rank's KV
  range is a :class:`~workbench.core.worker.WorkerState` behind a
  :class:`~workbench.transport.server.Server` (its Unix socket, served from a thread of the
  worker), and the rank announces itself (socket, geometry, rank) in a rendezvous folder named
  after its parent, the engine-core process;
* **scheduler side** (the engine-core process, when the BlockPool is built, after every worker
  has allocated): the ledger's space is a :class:`~workbench.core.coordinator.FanOutSpace` over
  :class:`~workbench.transport.SocketTransport` to every announced rank, so each map is
  all-or-nothing across ranks and each unmap a prepare/commit transaction (the TP semantics the
  core proves).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import threading
from pathlib import Path

from workbench.adapters import runtime
from workbench.adapters.vllm.ledger import BlockLedger
from workbench.core.geometry import KVGeometry
from workbench.core.messages import WorkerId
from workbench.core.vspace import KVSpace
from workbench.errors import ConfigError
from workbench.transport.paths import base_dir, shared_dir

PREFIX = "VllmWorker-"


def worker_rank() -> int | None:
    """This process's rank when it is a vLLM multiprocessing worker, else None."""
    name = multiprocessing.current_process().name
    if not name.startswith(PREFIX):
        return None
    return int(name[len(PREFIX):])


def rendezvous(engine_pid: int) -> Path:
    """Where an engine core and its workers meet; owned by the engine core, so ``kvctl gc``
    removes it once that process is gone."""
    return shared_dir(f"vllm-engine-{engine_pid}", engine_pid)


def serve_rank(geo: KVGeometry, rank: int, num_blocks: int, backend: str = "host") -> KVSpace:
    """Start this rank's page server; the returned space is the one it maps into."""
    from workbench.transport.server import Server

    d = rendezvous(os.getppid())
    sock = d / f"rank{rank}.sock"
    cfg = {"path": str(sock), "parent": os.getppid(), "name": f"vllm-rank{rank}",
           "backend": backend, "geometry": {f.name: getattr(geo, f.name)
                                             for f in dataclasses.fields(geo)}}
    server = Server(cfg)
    threading.Thread(target=server.serve, name=f"workbench-kv-rank{rank}", daemon=True).start()
    note = {"socket": str(sock), "rank": rank, "num_blocks": num_blocks,
            "geometry": cfg["geometry"]}
    tmp = d / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(note))
    tmp.rename(d / f"rank{rank}.json")
    return server.state.space


def scheduler_ledger(num_blocks: int) -> BlockLedger | None:
    """The engine core's ledger over every announced rank; None when no worker announced."""
    from workbench.core.coordinator import FanOutSpace
    from workbench.transport import SocketTransport

    d = base_dir() / f"vllm-engine-{os.getpid()}"
    notes = [json.loads(p.read_text()) for p in sorted(d.glob("rank*.json"))] \
        if d.is_dir() else []
    notes = [n for n in notes if n["num_blocks"] == num_blocks]
    if not notes:
        return None
    geos = {json.dumps(n["geometry"], sort_keys=True) for n in notes}
    if len(geos) != 1:
        raise ConfigError(f"{len(notes)} vLLM ranks", "announced different KV geometries",
                          "run every rank with the same model and cache settings")
    geo = KVGeometry(**notes[0]["geometry"])
    targets = {WorkerId(0, n["rank"]): Path(n["socket"]) for n in notes}
    space = FanOutSpace(geo, SocketTransport(targets), sorted(targets), pool="vllm-fanout")
    cfg = runtime.pool_config(contiguous_layout=geo.layout.value == "contiguous")
    return BlockLedger(geo, space=space, name=f"vllm-fanout-tp{len(targets)}", config=cfg)
