"""SGLang's cross-process admission under a shared GPU budget, engine-free: two real processes,
each an SGLang-style allocator (``LedgerSlots`` over a host ledger charged to one budget file),
race for the last pages. SGLang admits on the headroom it sees and raises if the allocation
after it misses; ``admit`` takes the charge at admission, so exactly the processes whose
admission the budget covers are admitted, and each admitted allocation is served, whatever the
other process does in between. Without it the hazard is real (the first test shows it)."""

from __future__ import annotations

import random
import textwrap

import pytest

from tests.line_worker import LineWorker
from workbench.core import budget_segment as bs

pytest.importorskip("torch")

PAGES = 16  # the pool's virtual capacity, in page ids
BUDGET_PAGES = 10  # the GPU budget both processes share: page 0 of each (the null block's)
LEFT = BUDGET_PAGES - 2  # and 8 to race for

WORKER = textwrap.dedent("""
    import sys
    from workbench.adapters.runtime import make_ledger
    from workbench.adapters.sglang.slots import LedgerSlots
    from workbench.backends import make_device
    from workbench.config import PoolConfig
    from workbench.core.budget_device import budgeted
    from workbench.viz.scenarios import small_geometry

    shm, pages, budget_pages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    geo = small_geometry(num_pages=pages)
    dev = budgeted(make_device("host"), budget_pages * geo.page_id_bytes, shm_dir=shm)
    kv = make_ledger(geo, dev, "adm", PoolConfig(gpu_utilization=1.0, prealloc=False,
                                                 min_reserved_pages=0, max_reserved_pages=0))
    s = LedgerSlots.over(kv)
    per = geo.blocks_per_page(0)
    null_page = s.alloc_slots(per - 1)  # the rest of page 0, which the null block maps
    held = []
    print("ready", per, flush=True)
    for line in sys.stdin:
        op, n = line.split()
        n = int(n) * per  # slots of whole pages (page_size 1: a slot is a block)
        if op == "room":
            print(s._room() // per, flush=True)
        elif op == "admit":
            print("yes" if s.admit(n) else "no", flush=True)
        elif op == "alloc":
            got = s.alloc_slots(n)
            if got is not None:
                held.append(got)
            print("miss" if got is None else "ok", flush=True)
        elif op == "free":
            while held:
                s.free_slots(held.pop())
            print("freed", flush=True)
    s.free_slots(null_page)
    kv.close()
""")


class Engine(LineWorker):
    """One allocator process, driven line by line."""

    def __init__(self, shm) -> None:
        super().__init__(WORKER, str(shm), str(PAGES), str(BUDGET_PAGES))


@pytest.fixture
def engines(tmp_path):
    a, b = Engine(tmp_path), Engine(tmp_path)
    yield a, b
    a.close()
    b.close()
    assert bs.read_budget(bs.budget_path("host", tmp_path)).held == 0  # every charge credited


def test_without_the_admission_charge_another_process_takes_the_headroom(engines):
    a, b = engines
    assert a.ask("alloc", LEFT - 2) == "ok"  # 2 pages of the budget left
    assert a.ask("room") == "2" and b.ask("room") == "2"  # both would admit 2 pages
    assert b.ask("alloc", 2) == "ok"  # b maps them first
    assert a.ask("alloc", 2) == "miss"  # what SGLang would raise on after admitting
    a.ask("free")
    b.ask("free")


def test_an_admitted_allocation_is_served_whatever_the_other_process_does(engines):
    a, b = engines
    assert a.ask("alloc", LEFT - 2) == "ok"
    assert a.ask("admit", 2) == "yes"  # the charge taken at admission
    assert b.ask("room") == "0" and b.ask("admit", 1) == "no"
    assert b.ask("alloc", 2) == "miss"  # a miss for b (it evicts or waits), not a's crash
    assert a.ask("alloc", 2) == "ok"
    a.ask("free")
    assert b.ask("admit", 2) == "yes" and b.ask("alloc", 2) == "ok"
    b.ask("free")


def test_an_admission_not_used_is_credited_back(engines):
    a, b = engines
    assert a.ask("admit", 3) == "yes"
    assert b.ask("room") == str(LEFT - 3)
    assert a.ask("alloc", 1) == "ok"  # takes one page of the three; two are credited
    assert b.ask("room") == str(LEFT - 1)
    a.ask("free")


def test_two_processes_racing_for_the_last_pages(engines):
    """Both ask at once (both requests written before either answer is read): the budget's
    lock orders them, so the outcome is exact whichever comes first."""
    a, b = engines
    rng = random.Random(0)
    for _ in range(40):
        base_a, base_b = rng.randint(0, 4), rng.randint(0, 4)
        for e, base in ((a, base_a), (b, base_b)):
            if base:
                assert e.ask("alloc", base) == "ok"
        left = LEFT - base_a - base_b
        want_a, want_b = rng.randint(1, 4), rng.randint(1, 4)
        a.send("admit", want_a)
        b.send("admit", want_b)
        got_a, got_b = a.answer() == "yes", b.answer() == "yes"
        # never more admitted than there is; nobody refused while its share alone fits
        assert want_a * got_a + want_b * got_b <= left
        assert got_a or want_a > left - want_b * got_b
        assert got_b or want_b > left - want_a * got_a
        b.send("alloc", want_b)  # both allocate at once, admitted or not: the admitted
        a.send("alloc", want_a)  # are served, the others get a miss, never a raise
        got = {"a": a.answer(), "b": b.answer()}
        assert got["a"] == "ok" or not got_a, got
        assert got["b"] == "ok" or not got_b, got
        a.ask("free")
        b.ask("free")
