"""Real processes on the host device sharing one budget: racing for the last pages never
over-commits, and a process killed while holding pages gives them back."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import signal
import time

import pytest

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core.budget_device import budgeted
from workbench.core.budget_segment import SharedBudget, budget_path
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux host device")
GEO = KVGeometry(num_layers=1, kv_heads=2, head_dim=64, block_size=16, num_blocks=32 * 512)
PAGE_ID = GEO.page_id_bytes
CFG = PoolConfig(gpu_utilization=1.0, prealloc=False, min_reserved_pages=0, max_reserved_pages=0)
CTX = mp.get_context("fork")
PROCS = 8
PAGES = 20  # fewer than 8 processes want: every one of them races for the last pages


def _pool(shm: str, total: int, name: str) -> KVCacheManager:
    dev = budgeted(make_device("host"), total, shm_dir=shm)
    return KVCacheManager(GEO, dev, name=name, config=CFG, reserve_null_block=False)


def _racer(shm: str, total: int, go, done, out) -> None:
    """Map whole pages until a miss; report what was mapped and how every miss answered."""
    try:
        kv = _pool(shm, total, f"racer-{os.getpid()}")
        bpp = GEO.page_size // GEO.block_bytes
        go.wait()
        held, answer = [], "none"
        while True:
            ids = kv.alloc(bpp)
            if ids is None:
                answer = "None"
                break
            held.append(ids)
        out.put(("ok", os.getpid(), len(held), kv.device.inner.allocated_bytes, answer))
    except BaseException as err:  # a crash is what the test must never see
        out.put(("crash", os.getpid(), 0, 0, f"{type(err).__name__}: {err}"))
        return
    done.wait()
    kv.close()


@pytest.mark.parametrize("round_", range(5))
def test_processes_racing_for_the_last_pages_never_over_commit(tmp_path, round_):
    total = PAGES * PAGE_ID
    SharedBudget.open("host", total, shm_dir=tmp_path).close()
    go, done, out = CTX.Barrier(PROCS), CTX.Event(), CTX.Queue()
    procs = [CTX.Process(target=_racer, args=(str(tmp_path), total, go, done, out))
             for _ in range(PROCS)]
    for p in procs:
        p.start()
    try:
        reports = [out.get(timeout=60) for _ in procs]
        watcher = SharedBudget.open("host", None, shm_dir=tmp_path)
        state = watcher.state()
    finally:
        done.set()
        for p in procs:
            p.join(30)
    assert [r for r in reports if r[0] != "ok"] == []
    assert all(r[4] == "None" for r in reports)  # every miss was a clean None
    assert sum(r[2] for r in reports) == PAGES  # every page taken, none twice
    assert sum(r[3] for r in reports) == state.held == total  # physical memory == charges
    assert state.held <= state.total
    assert watcher.state().holders == {}  # every pool closed: every byte credited back
    watcher.close()


def _churn(shm: str, total: int, go, out, steps: int) -> None:
    b = SharedBudget.open("host", total, shm_dir=shm)
    go.wait()
    held = 0
    for i in range(steps):
        if (i * 7 + os.getpid()) % 3 and b.charge(PAGE_ID):
            held += PAGE_ID
        elif held:
            b.credit(PAGE_ID)
            held -= PAGE_ID
    out.put((os.getpid(), held, b.held_by_me()))


def test_charges_and_credits_racing_keep_the_sum_within_the_total(tmp_path):
    total = PAGES * PAGE_ID
    watcher = SharedBudget.open("host", total, shm_dir=tmp_path)
    go, out = CTX.Barrier(PROCS + 1), CTX.Queue()
    procs = [CTX.Process(target=_churn, args=(str(tmp_path), total, go, out, 300))
             for _ in range(PROCS)]
    for p in procs:
        p.start()
    go.wait()
    sums = []
    while any(p.is_alive() for p in procs) and len(sums) < 2000:
        sums.append(watcher.state().held)
    reports = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert max(sums) <= total
    assert all(mine == kept for _, kept, mine in reports)  # each slot says what it holds
    watcher.close()


def _grabber(shm: str, total: int, go, out, done) -> None:
    """Charge one unit at a time until a miss: the tightest race for the last bytes. Each stays
    running until all have missed: an exited grabber's bytes are free for the others to reclaim
    (a zombie is not running), which would be no over-commit but would break the count."""
    b = SharedBudget.open("host", total, shm_dir=shm)
    go.wait()
    n = 0
    while b.charge(UNIT):
        n += 1
    out.put(n)
    done.wait()


UNIT = 4096


def test_bare_charges_racing_for_the_last_bytes_never_over_commit(tmp_path):
    total = 4000 * UNIT  # 500 charges each if shared evenly: the processes overlap throughout
    SharedBudget.open("host", total, shm_dir=tmp_path).close()
    go, out, done = CTX.Barrier(PROCS), CTX.Queue(), CTX.Barrier(PROCS)
    procs = [CTX.Process(target=_grabber, args=(str(tmp_path), total, go, out, done))
             for _ in range(PROCS)]
    for p in procs:
        p.start()
    won = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert sum(won) * UNIT == total  # not one charge past the total, and none lost
    assert sum(1 for n in won if n) > 1  # they did race


def _holder(shm: str, total: int, ready, pages: int) -> None:
    kv = _pool(shm, total, "victim")
    for _ in range(pages):
        assert kv.alloc(GEO.page_size // GEO.block_bytes) is not None
    ready.set()
    time.sleep(60)


def _killed_holder(tmp_path, pages: int):
    ready = CTX.Event()
    p = CTX.Process(target=_holder, args=(str(tmp_path), PAGES * PAGE_ID, ready, pages))
    p.start()
    assert ready.wait(30)
    b = SharedBudget.open("host", None, shm_dir=tmp_path)
    assert b.state().held == pages * PAGE_ID
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    return b


def test_a_killed_holder_is_reclaimed_by_the_next_charger(tmp_path):
    b = _killed_holder(tmp_path, PAGES)
    assert b.charge(PAGE_ID)  # the whole total was the dead process's; the charge reclaims it
    state = b.state()
    assert state.held == PAGE_ID and [h.pid for h in state.holders.values()] == [os.getpid()]
    b.credit(PAGE_ID)
    b.close()


def test_a_killed_holder_is_reclaimed_by_gc(tmp_path):
    b = _killed_holder(tmp_path, 3)
    assert b.reclaim() == 3 * PAGE_ID
    assert b.state().holders == {}
    b.close()


def _lock_and_sleep(path: str, ready) -> None:
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    time.sleep(60)


def test_a_process_killed_inside_a_charge_does_not_wedge_the_budget(tmp_path):
    b = SharedBudget.open("host", PAGES * PAGE_ID, shm_dir=tmp_path)
    ready = CTX.Event()
    p = CTX.Process(target=_lock_and_sleep, args=(str(budget_path("host", tmp_path)), ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert b.charge(PAGE_ID)  # the kernel dropped the dead process's flock
    b.close()
