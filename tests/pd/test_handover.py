"""The transfer path's state (seed 003 E8): busy blocks are never handed out, leases end holds,
generations refuse stale reads, store keys carry the namespace, busy objects are not evicted;
and every fault row's criterion holds with its guard and fails without it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import ConfigError
from workbench.pd.faults_store import ROWS
from workbench.pd.handover import BlockPool, ObjectStore, kv_content, output_of, prefill

# what each row's unsafe variant (no guard) breaks: the guard is what holds the criterion
UNSAFE_FAILS = {
    "lookup-then-gone": {"no unloaded token skipped", "output unchanged"},
    "cancel-in-flight": {"no block reused while written", "B's output unchanged"},
    "save-after-finish": {"saved object is A's alone", "a later reuse gives the same output"},
    "store-slow": {"nothing blocks for ever"},
    "p-or-d-fails": {"no permanent hold"},
    "identity-change": {"no incompatible KV reused",
                        "output matches the new identity's prefill"},
    "capacity-exhausted": {"protected objects intact", "only idle objects evicted"},
}


@pytest.mark.parametrize("row", list(ROWS))
def test_criterion_holds_with_the_guard_and_fails_without(row):
    safe, unsafe = ROWS[row](True), ROWS[row](False)
    assert safe.passed and len(safe.checks) >= 2
    assert {k for k, ok in unsafe.checks.items() if not ok} == UNSAFE_FAILS[row]
    phases = [s.phase for s in safe.steps]
    after = [i for i, p in enumerate(phases) if p in ("cleanup", "fallback")]
    assert "fault" in phases and after and phases.index("fault") < max(after)


def test_rows_are_the_seeds_seven_and_leave_nothing_held():
    assert len(ROWS) == 7
    assert ROWS["lookup-then-gone"]().state == {"lookup_hit_tokens": 16, "loaded_tokens": 8,
                                                "recomputed_tokens": 8, "residual_blocks": 0}
    slow = ROWS["store-slow"]()
    # 8 requests time out at 0.2 s, then recompute 2 at a time for 0.1 s each: 4 waves
    assert slow.state["peak_fallback"] == 2 and slow.state["recovery_s"] == pytest.approx(0.6)
    # D dies: P's lease frees the pinned source; P dies: D's pull times out, landing blocks go
    assert ROWS["p-or-d-fails"]().state == {"residual_blocks_after_lease": 0,
                                            "d_landing_blocks_held": 0, "recomputed_tokens": 32}
    assert ROWS["p-or-d-fails"](False).state["d_landing_blocks_held"] == 4
    cap = ROWS["capacity-exhausted"]().state
    assert (cap["saved_chunks"], cap["refused_chunks"], cap["evicted"]) == (1, 1, 1)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["alloc", "release", "write_on", "write_off",
                                               "pin", "unpin", "settle"]),
                              st.integers(0, 7)), max_size=60))
def test_a_busy_block_is_never_handed_out(ops):
    pool = BlockPool(8, 2)
    owned: list[int] = []
    for op, b in ops:
        blk = pool.blocks[b]
        if op == "alloc":
            got = pool.alloc(1, "r")
            if got is not None:
                assert not pool.blocks[got[0]].writing and pool.blocks[got[0]].pins == 0
                owned += got
        elif op == "release" and b in owned:
            owned.remove(b)
            pool.release([b])
        elif op == "write_on" and b in owned:
            blk.writing = True
        elif op == "write_off":
            blk.writing = False
        elif op == "pin" and b in owned:
            pool.pin([b])
        elif op == "unpin":
            pool.unpin([b])
        elif op == "settle":
            pool.settle(0.0)
        assert len(set(pool.free)) == len(pool.free)
        assert not set(pool.free) & set(owned)


def test_lease_generation_and_namespace_rules():
    pool = BlockPool(2, 2)
    a = pool.alloc(2, "A")
    gen = pool.blocks[a[0]].generation
    pool.pin(a, lease_until=1.0)
    assert pool.release(a, 0.5) == a and pool.held == 2  # pinned: deferred
    assert pool.settle(0.9) == [] and pool.settle(1.0) == a and pool.held == 0
    b = pool.alloc(2, "B")
    assert b is not None and pool.read(a[0], gen) is None  # reused: stale read refused
    assert pool.read(b[0], pool.blocks[b[0]].generation) is not None
    store = ObjectStore(2)
    assert store.key("m", 1) != store.key("m+lora", 1)
    assert ObjectStore(2, guards=False).key("m", 1) == ObjectStore(2, guards=False).key("x", 1)
    obj = store.admit(store.key("m", 1))
    assert not store.lookup(store.key("m", 1))  # invisible until complete
    obj.complete = True
    assert store.lookup(store.key("m", 1)) and store.metadata_requests == 2
    with pytest.raises(ConfigError, match="is empty"):
        BlockPool(0)


def test_kv_content_depends_on_namespace_and_prefix():
    t = [1, 2, 3]
    assert kv_content("m", t, 1) == kv_content("m", [1, 2, 9], 1)  # later tokens do not matter
    assert kv_content("m", t, 1) != kv_content("n", t, 1)
    assert kv_content("m", t, 1) != kv_content("m", [7, 2, 3], 1)
    kv = prefill("m", t)
    assert output_of(kv) != output_of(kv[:2] + [kv[2] + 1])
