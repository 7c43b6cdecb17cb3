"""The admission charge on SGLang's scheduler seams (``adapters/sglang/admission.py``), over
stand-ins for SGLang's ``PrefillAdder`` and ``ScheduleBatch`` (``sgl_standin.py``): two real
processes, each a scheduler over an elastic allocator charged to one shared GPU budget file, race
for the last pages. Unpatched, SGLang's rule lets both admit on the same headroom and the loser
raises "Out of memory" at its allocation; patched, whatever is admitted is allocated, a charge
that misses is a ``NO_TOKEN`` (prefill) or a failed check (decode, SGLang retracts), and every
charge is credited back. Then the seams' checks: a moved seam is refused in one line."""

from __future__ import annotations

import importlib
import random
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from workbench.core import budget_segment as bs

pytest.importorskip("torch")

from tests.adapters import sgl_standin  # noqa: E402
from tests.line_worker import LineWorker  # noqa: E402
from workbench.adapters.registry import AutopatchError, EnginePlan, Patch  # noqa: E402
from workbench.adapters.sglang import seams  # noqa: E402

PAGES = 16  # the pool's virtual capacity, in page ids
BUDGET_PAGES = 10  # the GPU budget both processes share: page 0 of each (the null block's)
LEFT = BUDGET_PAGES - 2  # and 8 to race for

WORKER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[4])
    import sgl_standin as sgl
    from workbench.adapters.runtime import make_ledger
    from workbench.adapters.sglang import seams
    from workbench.backends import make_device
    from workbench.config import PoolConfig
    from workbench.core.budget_device import budgeted
    from workbench.viz.scenarios import small_geometry

    shm, pages, budget_pages, _, patched = sys.argv[1:6]
    geo = small_geometry(num_pages=int(pages))
    dev = budgeted(make_device("host"), int(budget_pages) * geo.page_id_bytes, shm_dir=shm)
    kv = make_ledger(geo, dev, "adm", PoolConfig(gpu_utilization=1.0, prealloc=False,
                                                 min_reserved_pages=0, max_reserved_pages=0))
    if patched == "1":
        seams.apply_adder(sgl)
        seams.apply_decode(sgl)
    alloc, cache = sgl.Allocator.over(kv), sgl.Cache()
    per = geo.blocks_per_page(0)
    null_page = alloc.alloc_slots(per - 1)  # the rest of page 0, which the null block maps
    held, adder, batch = [], None, None
    print("ready", flush=True)

    def keep(out):
        held.append(out)
        return "ok"

    def run(op, n):
        global adder, batch
        if op == "room":
            return str(alloc.available_size() // per)
        if op == "alloc":  # another request's pages, mapped outside any admission
            out = alloc.alloc(n * per)
            return "miss" if out is None else keep(out)
        if op == "cache":  # a finished request's n pages, kept by the radix cache (evictable)
            out = alloc.alloc(n * per)
            cache.entries.append(out)
            return "miss" if out is None else "ok"
        if op == "evict":  # the pass's eviction for what it admitted, before it allocates
            sgl.evict_for(adder, sgl.admitted_tokens(adder))
            return "evicted"
        if op == "admit":  # a prefill pass admits one request of n pages
            adder = sgl.PrefillAdder(cache, alloc)
            got = adder.add_one_req(sgl.Req("r", n * per))
            return "yes" if got is sgl.AddReqResult.CONTINUE else "no"
        if op == "extend":  # the pass allocates what it admitted
            out = sgl.prepare_for_extend(adder)
            return "none" if out is None else keep(out)
        if op == "decode":  # a decode step of n * per requests checks its memory
            batch = sgl.ScheduleBatch([sgl.Req(str(i), 1) for i in range(n * per)], alloc, cache)
            return "yes" if batch.check_decode_mem() else "no"
        if op == "step":  # and allocates one slot each
            return keep(sgl.alloc_token_slots(alloc, len(batch.reqs)))
        cache.evict(alloc, alloc.size)  # free: the cache's entries and the requests' pages
        while held:
            alloc.free_slots(held.pop())
        return "freed"

    for line in sys.stdin:
        op, n = line.split()
        try:
            print(run(op, int(n)), flush=True)
        except RuntimeError as err:
            print("raise" if "Out of memory" in str(err) else repr(err), flush=True)
    alloc.free_slots(null_page)
    kv.close()
""")


class Engine(LineWorker):
    """One scheduler process, driven line by line."""

    def __init__(self, shm, patched: bool) -> None:
        here = str(Path(sgl_standin.__file__).parent)
        super().__init__(WORKER, str(shm), str(PAGES), str(BUDGET_PAGES), here,
                         "1" if patched else "0")


def pair(tmp_path, patched: bool):
    a, b = Engine(tmp_path, patched), Engine(tmp_path, patched)
    yield a, b
    a.close()
    b.close()
    assert bs.read_budget(bs.budget_path("host", tmp_path)).held == 0  # every charge credited


@pytest.fixture
def stock(tmp_path):
    yield from pair(tmp_path, patched=False)


@pytest.fixture
def patched(tmp_path):
    yield from pair(tmp_path, patched=True)


def test_unpatched_sglang_admits_on_headroom_another_process_then_takes(stock):
    a, b = stock
    assert a.ask("alloc", LEFT - 2) == "ok"  # 2 pages of the budget left
    assert a.ask("admit", 2) == "yes" and b.ask("room") == "2"  # a admitted on them
    assert b.ask("alloc", 2) == "ok"  # b maps them first
    assert a.ask("extend") == "raise"  # SGLang's "Out of memory" after admitting
    a.ask("free")
    b.ask("free")


def test_a_prefill_admitted_is_allocated_whatever_the_other_process_does(patched):
    a, b = patched
    assert a.ask("alloc", LEFT - 2) == "ok"
    assert a.ask("admit", 2) == "yes"  # the charge taken as the adder admits
    assert b.ask("room") == "0" and b.ask("admit", 1) == "no"  # NO_TOKEN: b waits
    assert b.ask("alloc", 2) == "miss"  # a miss for b (it evicts or waits), not a's crash
    assert a.ask("extend") == "ok"
    a.ask("free")
    assert b.ask("admit", 2) == "yes" and b.ask("extend") == "ok"
    b.ask("free")


@pytest.mark.parametrize("patch", [False, True], ids=["stock", "patched"])
def test_pages_evicted_for_an_admitted_request_stay_its_own(tmp_path, patch):
    """The budget is full; the admitted request is served from what its pass evicts of this
    process's cache. Stock, the pages evicted go back to the budget and the other process takes
    them before the allocation; patched, they keep their charge for it."""
    for a, b in pair(tmp_path, patched=patch):
        assert a.ask("cache", 2) == "ok" and b.ask("alloc", LEFT - 2) == "ok"  # budget full
        assert a.ask("admit", 2) == "yes"  # on what the cache can evict
        assert a.ask("evict") == "evicted"
        assert b.ask("alloc", 2) == ("miss" if patch else "ok")
        assert a.ask("extend") == ("ok" if patch else "raise")
        a.ask("free")
        b.ask("free")


def test_a_decode_step_checked_is_allocated_and_a_short_one_fails_its_check(patched):
    a, b = patched
    assert a.ask("alloc", LEFT - 2) == "ok"
    assert a.ask("decode", 2) == "yes"  # the step's pages charged as its check passes
    assert b.ask("decode", 1) == "no"  # b's check fails: SGLang retracts, no raise
    assert a.ask("step") == "ok"
    a.ask("free")
    assert b.ask("decode", 1) == "yes" and b.ask("step") == "ok"
    b.ask("free")


def test_a_charge_not_used_is_credited_back(patched):
    a, b = patched
    assert a.ask("admit", LEFT + 1) == "no"  # not admitted: nothing kept
    assert b.ask("room") == str(LEFT)
    assert a.ask("admit", 3) == "yes" and b.ask("room") == str(LEFT - 3)
    assert a.ask("admit", 0) == "yes"  # the next pass starts from no charge (none allocated)
    assert b.ask("room") == str(LEFT)


@pytest.mark.parametrize("seed", range(4))
def test_two_schedulers_racing_for_the_last_pages(patched, seed):
    """Both admit at once and both allocate at once (both requests written before either
    answer is read): the budget's lock orders them; the outcome is exact whichever is first."""
    a, b = patched
    rng = random.Random(seed)
    for _ in range(25):
        base_a, base_b = rng.randint(0, 4), rng.randint(0, 4)
        for e, base in ((a, base_a), (b, base_b)):
            if base:
                assert e.ask("alloc", base) == "ok"
        left = LEFT - base_a - base_b
        want_a, want_b = rng.randint(1, 4), rng.randint(1, 4)
        a.send("admit", want_a)
        b.send("admit", want_b)
        got_a, got_b = a.answer() == "yes", b.answer() == "yes"
        assert want_a * got_a + want_b * got_b <= left  # never more admitted than there is
        assert got_a or want_a > left - want_b * got_b  # nobody refused while its share fits
        assert got_b or want_b > left - want_a * got_a
        b.send("extend")
        a.send("extend")
        assert (a.answer(), b.answer()) == ("ok" if got_a else "none", "ok" if got_b else "none")
        a.ask("free")
        b.ask("free")


# -- the seams' checks -----------------------------------------------------------------------
def test_the_stand_ins_pass_the_checks_the_plans_run():
    assert seams.check_adder(sgl_standin) is None
    assert seams.check_decode(sgl_standin) is None


def _moved_decode(self, buf_multiplier=1, selected_indices=None):
    return True


@pytest.mark.parametrize(("check", "module", "why"), [
    (seams.check_adder, SimpleNamespace(), "has no PrefillAdder, Req or AddReqResult.NO_TOKEN"),
    (seams.check_adder, SimpleNamespace(
        PrefillAdder=sgl_standin.PrefillAdder, AddReqResult=sgl_standin.AddReqResult,
        Req=type("Req", (), {"__init__": sgl_standin.Cache.evictable_size})),
     "no longer uses self.prefix_indices"),
    (seams.check_decode, SimpleNamespace(ScheduleBatch=type(
        "ScheduleBatch", (sgl_standin.ScheduleBatch,), {"check_decode_mem": _moved_decode})),
     "check_decode_mem's first parameter is ['buf_multiplier'], not selected_indices"),
])
def test_a_moved_seam_is_named(check, module, why):
    assert why in check(module)


def test_a_moved_server_side_seam_refuses_the_plan_in_one_line(tmp_path, monkeypatch):
    pkg = tmp_path / "fakeeng40"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '1.0'\n")
    (pkg / "policy.py").write_text("class PrefillAdder:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("fakeeng40")  # (its version is read from the loaded package)

    def plan(module: str) -> EnginePlan:
        return EnginePlan("fakeeng40", "fakeeng40", ("fakeeng40",), [Patch(
            "admission-charge", module, ">=1.0,<2.0", seams.apply_adder, seams.check_adder,
            server_side=True, fix="install fakeeng40==1.0")])

    try:
        absent = plan("fakeeng40.server_only")  # no server stack here: skipped, not refused
        absent.apply_all()
        assert absent.state == "applied" and absent.records[0].status == "skipped"
        moved = plan("fakeeng40.policy")
        with pytest.raises(AutopatchError) as err:
            moved.apply_all()
        msg = str(err.value)
        assert "\n" not in msg and "patch 'admission-charge'" in msg
        assert "has no PrefillAdder, Req or AddReqResult.NO_TOKEN" in msg
    finally:
        for name in [m for m in sys.modules if m.startswith("fakeeng40")]:
            del sys.modules[name]
