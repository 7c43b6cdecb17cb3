"""A busy vLLM has no idle moment, so a reserve that allocations drain during a burst was mapped
back inline, inside the next allocation: at batch 64 on an H100, 14 page ids mapped on the decode
path cost 2.4 % of TPOT. vLLM's step is two calls: the worker's ``execute_model`` launches the
forward pass and returns, then ``sample_tokens`` waits for it. Between the two the GPU is busy and
the engine's thread is not: there every elastic pool of the process maps its reserve back up to
its minimum, and from then on an allocation that drains the reserve leaves the refill to that
moment."""

from __future__ import annotations

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.adapters.test_vllm_idle_tidy import BPP, _causes, _pool, heard
from workbench.core.events import PageState


def test_a_step_refills_the_reserve_so_the_next_allocation_maps_nothing(monkeypatch):
    pool, kv, registry = _pool(monkeypatch, "step-refill")
    p = kv.pages
    assert len(p.reserved) == 2  # the pool starts with its minimum
    registry.refill_in_step()  # the first step: nothing short, the refill is due here now
    mark = len(kv.events)
    a = pool.get_new_blocks(15 + 2 * BPP)  # the rest of page 0, then both reserved pages
    assert sorted(_causes(kv, mark)) == ["reuse", "reuse"] and p.reserved == []
    mark = len(kv.events)
    registry.refill_in_step()  # the forward runs: the reserve is mapped back
    assert _causes(kv, mark) == ["prealloc", "prealloc"] and len(p.reserved) == 2
    mark = len(kv.events)
    b = pool.get_new_blocks(2 * BPP)
    assert sorted(_causes(kv, mark)) == ["reuse", "reuse"]  # no map on the allocation's path
    pool.free_blocks(a + b)
    kv.check_invariants()
    kv.close()


def test_an_allocation_past_the_reserve_still_maps_its_own_pages_inline(monkeypatch):
    """The refill only moves the reserve's own maps; what a request needs beyond the reserve is
    mapped in its allocation, as without the step patch (the pages must be backed before the
    forward pass writes them)."""
    pool, kv, registry = _pool(monkeypatch, "step-burst")
    registry.refill_in_step()
    mark = len(kv.events)
    held = pool.get_new_blocks(15 + 4 * BPP)  # four pages: two reserved, two mapped
    assert sorted(_causes(kv, mark)) == ["map", "map", "reuse", "reuse"]
    assert kv.pages.reserved == []  # the refill waits for the step
    pool.free_blocks(held)
    kv.close()


# a failed or closed pool, and a refill whose map fails: tests/adapters/test_vllm_idle_tidy.py
# runs them for both moments (MOMENTS)


def test_a_map_of_unknown_outcome_in_a_step_fails_the_pool_not_the_step(monkeypatch, caplog):
    from workbench.errors import PoolFailedError, StateConsistencyError

    pool, kv, registry = _pool(monkeypatch, "step-broken")
    registry.refill_in_step()
    pool.get_new_blocks(15 + 2 * BPP)

    def lost(page):
        raise StateConsistencyError(f"page {page}: the reply was lost")

    monkeypatch.setattr(kv.space, "map_page", lost)
    # returns: vLLM's step samples its tokens; the second finds a failed pool and says nothing
    lines = heard(caplog, registry.refill_in_step, registry.refill_in_step)
    assert kv.pages.failed is not None
    (line,) = lines
    assert line.startswith("workbench: pool step-broken failed while a step ran: page ")
    assert line.endswith("the reply was lost") and "\n" not in line
    assert pool.get_num_free_blocks() == 0  # vLLM's scheduler schedules nothing more on it
    with pytest.raises(PoolFailedError):
        kv.pages.check_ok()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("alloc"), st.integers(1, 40)),
                          st.tuples(st.just("free"), st.integers(0, 5)),
                          st.just(("step", 0)), st.just(("idle", 0))), max_size=30))
def test_step_refills_keep_the_pool_whole_and_keep_maps_off_the_reserves_path(ops):
    """After any mix of allocations, frees, steps and idle moments: the ledger's invariants hold;
    after a step the reserve is at its minimum or takes every page that could still be mapped;
    once a step or an idle moment has refilled, no allocation refills inline."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        pool, kv, registry = _pool(monkeypatch, "step-prop")
        p, held, refilling = kv.pages, [], False
        for op, n in ops:
            mark = len(kv.events)
            if op == "alloc" and n <= pool.get_num_free_blocks():
                held.append(pool.get_new_blocks(n))
            elif op == "free" and held:
                pool.free_blocks(held.pop(n % len(held)))
            elif op in ("step", "idle"):
                (registry.refill_in_step if op == "step" else registry.tidy_idle)()
                refilling = True
                assert len(p.reserved) >= p.min_reserved or p.new_pages_possible() == 0
            if refilling and op in ("alloc", "free"):
                assert "prealloc" not in _causes(kv, mark)
            kv.check_invariants()
        in_use = p.counts[PageState.IN_USE]
        assert in_use <= p.mapped_pages
        kv.close()


def _worker_module(two_phase: bool = True) -> types.ModuleType:
    log: list[str] = []

    class Runner:
        def sample_tokens(self, grammar):
            log.append(f"sample {grammar}")
            return "tokens"

    class Worker:
        model_runner = Runner()

        def execute_model(self, scheduler_output):
            log.append("launch")

        if two_phase:
            def sample_tokens(self, grammar_output):
                return self.model_runner.sample_tokens(grammar_output)
        else:
            def sample_tokens(self, grammar_output):
                return "tokens"

    return types.SimpleNamespace(__name__="vllm.v1.worker.gpu_worker", Worker=Worker, log=log)


def test_the_step_seam_refills_after_the_launch_and_before_the_wait(monkeypatch):
    from workbench.adapters.vllm import registry, seams

    m = _worker_module()
    assert seams.check_step(m) is None
    monkeypatch.setattr(registry, "refill_in_step", lambda: m.log.append("refill"))
    undo = seams.apply_step(m)
    w = m.Worker()
    w.execute_model(None)
    assert w.sample_tokens("g") == "tokens"
    assert m.log == ["launch", "refill", "sample g"]
    undo()
    assert w.sample_tokens("h") == "tokens" and m.log[3:] == ["sample h"]


def test_a_worker_whose_step_is_one_call_is_named_and_skipped():
    from workbench.adapters.vllm import seams

    why = seams.check_step(_worker_module(two_phase=False))
    assert "sample_tokens no longer uses self.model_runner.sample_tokens(" in why
    assert "has no Worker" in seams.check_step(types.SimpleNamespace())
    patch = seams.step_patch(">=0.26.0,<0.27.0", "fix")
    assert patch.required is False and patch.module == "vllm.v1.worker.gpu_worker"
