"""TP/PP across real worker OS processes over Unix sockets (CPU: SimDevice memory per worker).

Robust on a loaded 2-core machine: generous timeouts, no timing assertions. Faults are armed in
the worker process through its ``inject`` hook (a failing driver call, a reply never sent, a
stalled reply, a crash) or by SIGKILL from here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tpp.helpers import BPP, GEO
from workbench.config import PoolConfig
from workbench.core.coordinator import TransportError, WorkerId
from workbench.core.events import PageState
from workbench.core.ledger import KVCacheManager
from workbench.errors import PoolFailedError, StateConsistencyError
from workbench.transport import WorkerGroup, gc_sockets

pytestmark = pytest.mark.usefixtures("socket_base")

S = PageState
W0, W1 = WorkerId(0, 0), WorkerId(0, 1)


def pool(g: WorkerGroup, **kw) -> KVCacheManager:
    return KVCacheManager(GEO, space=g.space(**kw), config=PoolConfig(
        prealloc=False, min_reserved_pages=0, max_reserved_pages=0))


def mapped(g: WorkerGroup) -> dict[WorkerId, set[int]]:
    return {t: set(s["mapped"]) for t, s in g.states().items()}


def test_tp2_pp2_pool_over_processes(socket_base):
    with WorkerGroup(GEO, tp=2, pp=2, name="tp2pp2") as g:
        assert stat.S_IMODE(os.stat(g.dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(socket_base).st_mode) == 0o700
        assert g.paths[WorkerId(1, 1)] == g.dir / "pp1" / "w1.sock"  # PP namespace
        kv = pool(g)
        ids = kv.alloc(3 * BPP)
        assert all(m == {0, 1, 2, 3} for m in mapped(g).values())
        kv.free(ids)
        kv.check_invariants()
        assert kv.space.inconsistencies(g.states()) == []
        kv.close()
        assert all(s["mapped"] == [] for s in g.states().values())
        d = g.dir
    assert not d.exists()  # sockets and directory removed on shutdown


def test_map_failure_rolls_back_across_processes():
    with WorkerGroup(GEO, tp=2, name="rollback") as g:
        kv = pool(g)
        g.inject(W1, device={"create": 1})
        assert kv.alloc(BPP) is None
        assert mapped(g) == {W0: {0}, W1: {0}}
        assert kv.alloc(BPP) is not None and not kv.pages.failed


def test_lost_map_reply_fails_pool():
    with WorkerGroup(GEO, tp=2, name="lostmap") as g:
        kv = pool(g)
        g.inject(W1, drop_reply="map")
        with pytest.raises(StateConsistencyError, match="outcome unknown"):
            kv.alloc(BPP)
        assert kv.pages.failed
        with pytest.raises(PoolFailedError):
            kv.alloc(1)


def test_stalled_reply_times_out_and_fails_pool():
    with WorkerGroup(GEO, tp=2, name="stall") as g:
        kv = pool(g)
        kv.space.timeout = 0.5  # only this exchange is meant to time out
        g.inject(W1, stall="map", seconds=2.0)
        with pytest.raises(StateConsistencyError):
            kv.alloc(BPP)
        assert kv.pages.failed and "within" in kv.pages.failed


def test_prepare_failure_aborts_across_processes():
    with WorkerGroup(GEO, tp=2, name="prepare") as g:
        kv = pool(g)
        ids = kv.alloc(BPP)
        g.inject(W1, device={"unmap": 1})
        kv.free(ids)
        assert kv.pages.state[1] is S.RESERVED and not kv.pages.failed
        assert mapped(g) == {W0: {0, 1}, W1: {0, 1}}


def test_lost_commit_reply_is_retried():
    with WorkerGroup(GEO, tp=2, name="commit") as g:
        kv = pool(g)
        ids = kv.alloc(BPP)
        g.inject(W1, drop_reply="commit")
        kv.free(ids)
        assert kv.pages.state[1] is S.FREE and not kv.pages.failed
        assert mapped(g) == {W0: {0}, W1: {0}}


def test_missing_stage_listener_fails_before_any_stage_changes():
    with WorkerGroup(GEO, tp=1, pp=2, name="nostage", missing=[WorkerId(1, 0)]) as g:
        with pytest.raises(TransportError, match="pp1/w0"):
            g.space()
    with WorkerGroup(GEO, tp=1, pp=2, name="gone") as g:
        fan = g.space()
        g.paths[WorkerId(1, 0)].unlink()  # stage 1's listener vanishes
        with pytest.raises(TransportError, match="pp1/w0"):
            fan.map_page(3)
        assert g.send(WorkerId(0, 0), {"op": "state"})["mapped"] == []  # stage 0 untouched
        assert not fan.failed


def test_worker_rejects_garbage_frames_and_keeps_serving():
    with WorkerGroup(GEO, tp=1, name="garbage") as g:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(g.paths[W0]))
            body = b"\x80\x04\x95 not json, a pickle header"
            s.sendall(len(body).to_bytes(4, "big") + body)
            assert s.recv(16) == b""  # dropped, nothing unpickled
        assert g.send(W0, {"op": "ping"})["status"] == "ok"


_COORDINATOR = """
import sys, time
from tests.tpp.helpers import GEO
from workbench.transport import WorkerGroup
g = WorkerGroup(GEO, tp=2, name="doomed")
g.space().map_page(2)
print(g.dir, flush=True)
time.sleep(600)
"""


def test_sigkill_survivors_stay_healthy_and_gc_cleans_up(socket_base):
    with WorkerGroup(GEO, tp=2, name="victim") as a, WorkerGroup(GEO, tp=2, name="survivor") as b:
        kva, kvb = pool(a), pool(b)
        ids_b = kvb.alloc(2 * BPP)
        a.kill(W1, signal.SIGKILL)
        # the other pool and its processes are unaffected
        kvb.free(ids_b)
        assert kvb.alloc(BPP) is not None and not kvb.pages.failed
        assert mapped(b) == {W0: {0, 1}, W1: {0, 1}}
        # the victim's pool notices at its next exchange and fails, loudly
        with pytest.raises(StateConsistencyError):
            kva.alloc(BPP)
        assert kva.pages.failed
        assert a.send(W0, {"op": "ping"})["status"] == "ok"  # its surviving rank still answers
        assert gc_sockets() == []  # every owner (this process) is alive: nothing to collect
        # a SIGKILLed coordinator: its workers leave, gc removes its directory
        proc = subprocess.Popen([sys.executable, "-c", _COORDINATOR], stdout=subprocess.PIPE,
                                text=True, cwd=Path(__file__).parents[2])
        try:
            doomed = Path(proc.stdout.readline().strip())
            assert doomed.is_dir()
        finally:
            proc.kill()
            proc.wait(30)
        deadline = time.monotonic() + 60
        while list(doomed.rglob("*.sock")) and time.monotonic() < deadline:
            time.sleep(0.1)  # orphaned workers notice their parent is gone and exit
        assert not list(doomed.rglob("*.sock"))
        assert gc_sockets() == [str(doomed)]
        assert not doomed.exists() and a.dir.exists() and b.dir.exists()
        b_dir = b.dir
    assert not b_dir.exists()
    with contextlib.suppress(FileNotFoundError):
        assert list(socket_base.iterdir()) == []


def test_host_memory_workers():
    """Workers backed by real host memory (memfd pages mapped into an mmap reservation)."""
    with WorkerGroup(GEO, tp=2, name="host", backend="host") as g:
        kv = pool(g)
        ids = kv.alloc(2 * BPP)
        assert mapped(g) == {W0: {0, 1, 2}, W1: {0, 1, 2}}
        g.inject(W1, device={"create": 1})
        assert kv.alloc(BPP) is None  # rank 0 rolled back a real mapping
        kv.free(ids)
        assert mapped(g) == {W0: {0}, W1: {0}}
        kv.check_invariants()
        kv.close()
