"""TP/PP page transactions on real worker processes, traced message by message (chapter 06).

A :class:`~workbench.transport.WorkerGroup` starts one OS process per TP rank and PP stage, each
owning its KV range on its own device (``sim`` memory, ``host`` memory or CUDA). The coordinator
side is the ordinary :class:`~workbench.core.ledger.KVCacheManager` over a
:class:`~workbench.core.coordinator.FanOutSpace` whose transport is wrapped in a
:class:`~workbench.viz.sequence.RecordingTransport`, so every request and reply that crossed a
socket can be drawn (:func:`traced_pool`).

:func:`run_case` runs one fault of :data:`CASES` on a fresh group; every group this module starts
is shut down when its ``with`` block ends, by :func:`close_all`, at interpreter exit (the group's
own ``atexit``), or, if this process is killed, by the workers themselves when they see their
parent gone. :func:`leftovers` says whether any socket directory or worker process of this
process is still there.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

from workbench.config import PoolConfig
from workbench.core.coordinator import FanOutSpace, WorkerId, targets_for
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError, WorkbenchError
from workbench.viz.processes import rebase
from workbench.viz.sequence import Message, RecordingTransport
from workbench.viz.trace import Recording

# 2 layers x K/V, 2 MiB pages: a page id is 8 MiB and holds 512 blocks; 16 page ids.
GEO = KVGeometry(num_layers=2, kv_heads=2, head_dim=64, block_size=16, num_blocks=8192)
BPP = GEO.page_size // GEO.block_bytes  # blocks per page
# no reserve: a page whose last block goes is unmapped at once (the transaction is visible)
NO_RESERVE = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=0)

_started: list[Any] = []  # every WorkerGroup this module started (open or not)


def worker_backend(backend: str) -> str:
    """Check that this host can build the device each worker will build, and return its name:
    the same :func:`workbench.backends.make_device` call the workers make (sim, host, gpu)."""
    from workbench.backends import make_device

    dev = make_device(backend)
    close = getattr(dev, "close", None)
    if callable(close):
        close()
    return backend


def open_group(*, tp: int = 2, pp: int = 1, name: str = "ch06", backend: str = "sim",
               missing: tuple[WorkerId, ...] = ()):
    """Start a WorkerGroup (use it in a ``with`` block: it shuts down on leaving, errors too)."""
    from workbench.transport import WorkerGroup

    g = WorkerGroup(GEO, tp, pp, name=name, backend=backend, missing=missing)
    _started.append(g)
    return g


def close_all() -> int:
    """Shut down every group this module started that is still open; returns how many."""
    n = 0
    for g in _started:
        if not g.closed:
            g.shutdown()
            n += 1
    return n


@dataclass(slots=True)
class Leftovers:
    dirs: list[str]  # socket directories of this process still on disk
    processes: list[int]  # worker pids started here and still running

    def __bool__(self) -> bool:
        return bool(self.dirs or self.processes)


def leftovers() -> Leftovers:
    """What this process's worker groups left behind (nothing, after a clean shutdown)."""
    from workbench.transport.paths import base_dir

    pid = os.getpid()
    try:
        names = sorted(e.name for e in base_dir().iterdir())
    except OSError:
        names = []
    # "<name>-<pid>-<token>", or ".new-<pid>-..." while one is being set up (transport.paths)
    mine = [n for n in names if f"-{pid}-" in n or n.startswith(f".new-{pid}-")]
    procs = [p.pid for g in _started for p in g.procs.values() if p.poll() is None]
    return Leftovers(mine, procs)


@dataclass(slots=True)
class Traced:
    """A pool whose every page decision fans out to a group's workers, recorded."""

    group: Any
    rt: RecordingTransport
    fan: FanOutSpace
    kv: KVCacheManager
    rec: Recording

    @property
    def participants(self) -> list[str]:
        return ["coordinator"] + [str(t) for t in self.fan.targets]

    def messages(self) -> list[Message]:
        return rebase(self.rt.messages)

    def workers(self) -> dict[str, dict[str, Any] | None]:
        """Each worker's own view (its ``state`` reply), None for one that does not answer."""
        out = {}
        for t in self.fan.targets:
            r = self.group.send(t, {"op": "state"}, timeout=5.0) \
                if self.group.procs[t].poll() is None else None
            out[str(t)] = None if r is None else {
                k: r.get(k) for k in ("mapped", "retained", "pending", "quarantined", "failed")}
        return out


def traced_pool(group, *, pp_rank: int = -1, defer_release: bool = False,
                timeout: float = 10.0) -> Traced:
    """A KVCacheManager over ``group``'s workers (every stage when ``pp_rank`` is -1). The null
    block's page is mapped while the pool is built; the recording starts after it."""
    rt = RecordingTransport(group.transport, name="coordinator")
    fan = FanOutSpace(GEO, rt, targets_for(group.tp, group.pp, pp_rank), timeout=timeout)
    rec = Recording()
    kv = KVCacheManager(GEO, space=fan, config=NO_RESERVE, events=rec.log,
                        defer_release=defer_release)
    rec.add_pool(kv)
    rt.messages.clear()
    return Traced(group, rt, fan, kv, rec)


@dataclass(frozen=True, slots=True)
class Case:
    fault: str  # in words
    on: str  # "map" (the alloc that backs page 1) or "unmap" (the free that empties it)
    inject: dict[str, Any] = field(default_factory=dict)  # armed on the last TP rank
    kill: bool = False  # SIGKILL the last TP rank instead


CASES: dict[str, Case] = {
    "commit": Case("none", "unmap"),
    "prepare fails": Case("rank 1's unmap fails in prepare", "unmap", {"device": {"unmap": 1}}),
    "prepare reply lost": Case("rank 1 prepares, its reply is lost", "unmap",
                               {"drop_reply": "prepare"}),
    "commit reply lost": Case("rank 1 commits, its reply is lost once", "unmap",
                              {"drop_reply": "commit"}),
    "map fails": Case("rank 1's create fails", "map", {"device": {"create": 1}}),
    "quarantine": Case("rank 1's set_access fails and so does its local undo", "map",
                       {"device": {"set_access": 1, "unmap": 1}}),
    "map reply lost": Case("rank 1 maps, its reply is lost", "map", {"drop_reply": "map"}),
    "worker killed": Case("rank 1 is SIGKILLed before the map", "map", kill=True),
}


@dataclass(slots=True)
class CaseResult:
    name: str
    fault: str
    messages: list[Message]
    participants: list[str]
    outcome: str  # what the call returned or raised
    page: str  # the state of page 1 (the page every case follows) in the coordinator
    failed: str | None  # why the pool failed, or None
    workers: dict[str, dict[str, Any] | None]
    disagree: list[str] | None  # pages held on some workers only (None: a worker is gone)


def run_case(name: str, *, backend: str = "sim", tp: int = 2) -> CaseResult:
    """Run one fault of :data:`CASES` on a fresh group of ``tp`` worker processes."""
    if name not in CASES:
        raise ConfigError(f"case {name!r}", "is not one of the chapter's fault cases",
                          f"use one of {', '.join(CASES)}")
    case = CASES[name]
    victim = WorkerId(0, tp - 1)
    with open_group(tp=tp, name=name.replace(" ", "-"), backend=backend) as g:
        t = traced_pool(g)
        ids = None
        if case.on == "unmap":
            ids = t.kv.alloc(BPP)  # fills page 0 (beside the null block) and opens page 1
            t.rt.messages.clear()
        if case.kill:
            g.kill(victim, signal.SIGKILL)
        elif case.inject:
            g.inject(victim, **case.inject)
        try:
            if case.on == "map":
                got = t.kv.alloc(BPP)
                outcome = "alloc → None (a miss)" if got is None else f"alloc → {len(got)} ids"
            else:
                t.kv.free(ids)
                outcome = "free returned"
        except WorkbenchError as err:
            outcome = f"{type(err).__name__}: {err}"
        workers = t.workers()
        alive = all(v is not None for v in workers.values())
        disagree = t.fan.inconsistencies(g.states()) if alive else None
        return CaseResult(name, case.fault, t.messages(), t.participants, outcome,
                          t.kv.pages.state[1].value, t.kv.pages.failed, workers, disagree)


def case_table(results: list[CaseResult]) -> str:
    """One line per case: fault, outcome, page 1, pool, and whether the workers agree."""
    rows = [f"{'case':<19} {'page 1':<12} {'pool':<7} {'workers':<17} outcome"]
    for r in results:
        agree = "one is gone" if r.disagree is None else \
            ("agree" if not r.disagree else f"differ: {r.disagree[0]}")
        out = r.outcome if len(r.outcome) <= 70 else r.outcome[:67] + "..."
        rows.append(f"{r.name:<19} {r.page:<12} {'FAILED' if r.failed else 'ok':<7} "
                    f"{agree:<17} {out}")
    return "\n".join(rows)


def case_html(results: list[CaseResult]) -> str:
    """The same rows as :func:`case_table` as an HTML table, each outcome in full (it wraps)."""
    import html

    cells = ["case", "page 1", "pool", "workers", "outcome"]
    head = "".join(f"<th style='text-align:left'>{c}</th>" for c in cells)
    body = []
    for r in results:
        agree = "one is gone" if r.disagree is None else \
            ("agree" if not r.disagree else f"differ: {r.disagree[0]}")
        row = [r.name, r.page, "FAILED" if r.failed else "ok", agree, r.outcome]
        body.append("<tr>" + "".join(f"<td style='text-align:left;vertical-align:top'>"
                                     f"{html.escape(str(v))}</td>" for v in row) + "</tr>")
    return f"<table class='wb-cases'><tr>{head}</tr>{''.join(body)}</table>"


def case_explorer(results: list[CaseResult], *, live: bool | None = None):
    """A case picker and a message slider over the cases' sequence diagrams (live), or every
    diagram one after another (static)."""
    from workbench.viz.live import figure, is_live
    from workbench.viz.sequence import sequence_figure

    live = is_live() if live is None else live
    by_name = {r.name: r for r in results}

    def draw(r: CaseResult, upto: int | None = None):
        return sequence_figure(r.messages, r.participants, upto=upto,
                               title=f"{r.name}: {r.fault} → page 1 {r.page}"
                                     f"{', pool FAILED' if r.failed else ''}")

    if not live:
        from IPython.display import display

        for r in results:
            display(figure(draw(r), live=False))
        return None
    import ipywidgets as w

    first = results[0]
    fig = figure(draw(first), live=True)
    pick = w.Dropdown(options=list(by_name), value=first.name, description="case")
    upto = w.IntSlider(value=len(first.messages), min=0, max=len(first.messages),
                       description="messages", continuous_update=False)

    def redraw(_change=None) -> None:
        r = by_name[pick.value]
        if upto.max != len(r.messages):
            upto.max = len(r.messages)
            upto.value = len(r.messages)
        new = draw(r, upto.value)
        with fig.batch_update():
            fig.layout = new.layout
            fig.data[0].x, fig.data[0].y = new.data[0].x, new.data[0].y

    pick.observe(redraw, names="value")
    upto.observe(redraw, names="value")
    box = w.VBox([w.HBox([pick, upto]), fig])
    box.add_class("wb-transactions")
    return box


_COORDINATOR = """
import json, time
from workbench.viz.transactions import GEO
from workbench.transport import WorkerGroup
g = WorkerGroup(GEO, tp=2, name="orphaned", backend={backend!r})
g.space().map_page(2)
print(json.dumps({{"dir": str(g.dir), "pids": [p.pid for p in g.procs.values()]}}), flush=True)
time.sleep(600)
"""


@dataclass(slots=True)
class OrphanResult:
    dir: str  # the killed coordinator's socket directory
    sockets_before: int  # worker sockets in it while the coordinator lived
    seconds_to_exit: float  # from SIGKILL until every orphaned worker had exited
    removed: list[str]  # what gc_sockets removed afterwards


def killed_coordinator(*, backend: str = "sim", timeout: float = 60.0) -> OrphanResult:
    """A coordinator process (with two workers) is SIGKILLed: it runs no cleanup. Its workers
    notice their parent is gone and exit; ``gc_sockets`` then removes the directory it left."""
    import json
    import subprocess
    import sys
    import time
    from pathlib import Path

    from workbench.transport import gc_sockets

    proc = subprocess.Popen([sys.executable, "-c", _COORDINATOR.format(backend=backend)],
                            stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        info = json.loads(proc.stdout.readline() or "{}")
        if "dir" not in info:
            raise ConfigError("the coordinator process", "exited before its workers listened",
                              f"run it by hand to see why: python -c {_COORDINATOR!r}")
        pids, pool_dir = info["pids"], Path(info["dir"])
        before = len(list(pool_dir.rglob("*.sock")))
        t0 = time.monotonic()
        proc.kill()  # SIGKILL: no atexit, no finally, no cleanup of any kind
        proc.wait(timeout)
        while (any(_running(p) for p in pids) or list(pool_dir.rglob("*.sock"))) \
                and time.monotonic() - t0 < timeout:
            time.sleep(0.05)
        waited = time.monotonic() - t0
        return OrphanResult(str(pool_dir), before, waited, gc_sockets())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout)
        for p in pids:  # workers that did not leave on their own (they should have)
            if _running(p):
                os.kill(p, signal.SIGKILL)
        if proc.stdout is not None:
            proc.stdout.close()


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit is reaped by whoever adopted it, maybe late)."""
    from workbench.procs import pid_alive

    return pid_alive(pid)
