from __future__ import annotations

import pytest

from workbench.engines.sched.request import ReqState
from workbench.engines.sched.scheduler import StepPlan
from workbench.engines.sim.workloads import poisson, prefix_groups

from ._helpers import run_single


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_all_requests_finish_and_kv_returns(kind):
    reqs = poisson(50.0, 40, prompt_len=64, output_len=32, seed=1)
    eng = run_single(kind, reqs, caching=False)
    assert all(r.state is ReqState.FINISHED and r.output_len == 32 for r in reqs)
    assert eng.kv.used_blocks == 0  # nothing cached, nothing leaked
    eng.kv.check_invariants()
    for r in reqs:
        assert r.arrival <= r.first_token <= r.finish
        assert len(r.token_times) == 32


def test_vllm_preempts_on_a_miss_and_recomputes():
    # 31 usable blocks of 16 tokens; 12 requests of 64+64 tokens need 8 blocks each
    reqs = poisson(1000.0, 12, prompt_len=64, output_len=64, seed=2)
    eng = run_single("vllm", reqs, num_blocks=32, caching=False)
    st = eng.scheduler.stats
    assert st.preemptions > 0 and st.misses > 0 and st.recomputed_tokens > 0
    assert any(r.preemptions for r in reqs)
    assert all(r.state is ReqState.FINISHED for r in reqs)
    assert eng.kv.used_blocks == 0


def test_sglang_retracts_on_a_miss():
    reqs = poisson(1000.0, 12, prompt_len=64, output_len=64, seed=2)
    eng = run_single("sglang", reqs, num_blocks=32, caching=False)
    assert eng.scheduler.stats.preemptions > 0
    assert eng.scheduler.new_token_ratio > eng.scheduler.min_ratio
    assert all(r.state is ReqState.FINISHED for r in reqs)
    assert eng.kv.used_blocks == 0


def test_vllm_token_budget_and_chunked_prefill():
    reqs = poisson(1000.0, 3, prompt_len=1000, output_len=4, seed=3)
    eng = run_single("vllm", reqs, budget=256, caching=False)
    sched = eng.scheduler
    # a 1000-token prompt needs ceil(1000/256) steps before its first token
    assert sched.stats.steps >= 3 * 4
    assert all(r.state is ReqState.FINISHED for r in reqs)


def test_step_plan_budget_respected():
    from workbench.engines.sched.block_pool import BlockPool
    from workbench.engines.sched.request import Request
    from workbench.engines.sched.vllm_sched import VLLMKVManager, VLLMScheduler

    from ._helpers import make_kv

    sched = VLLMScheduler(VLLMKVManager(BlockPool(make_kv(128, block_size=16),
                                                  enable_caching=False)),
                          max_num_batched_tokens=100)
    for i in range(3):
        sched.add_request(Request(i, list(range(80)), 4))
    plan = sched.schedule()
    assert isinstance(plan, StepPlan)
    assert plan.new_tokens == 100 and [n for _, n in plan.items] == [80, 20]
    sched.update(plan, 0.1)
    plan2 = sched.schedule()
    assert [n for _, n in plan2.items][:2] == [1, 60]  # a decode, then the chunk continues
    assert plan.num_prefill_tokens == 100 and plan2.num_prefill_tokens == plan2.new_tokens - 1


@pytest.mark.parametrize("kind,page", [("vllm", 16), ("sglang", 16), ("sglang", 1)])
def test_prefix_hit_depth_per_group(kind, page):
    warm, cases = prefix_groups(block_size=page, gap_s=1.0, per_group=3)
    eng = run_single(kind, [warm] + [c.request for c in cases], num_blocks=32768 // page,
                     block_size=page, blocks_per_page=4 if page == 16 else 64)
    got = {c.request.rid: c.request.prefix_hit_tokens for c in cases}
    for c in cases:
        assert got[c.request.rid] == c.expected_hit_tokens, (c.group, c.request.rid)
    depth = {g: max(c.expected_hit_tokens for c in cases if c.group == g) for g in "ABCD"}
    assert depth["A"] > depth["C"] > depth["B"] == depth["D"] == 0 or page == 1
    assert eng.scheduler.stats.prefix_hit_tokens == sum(got.values())


def test_prefix_cache_off_means_no_hits():
    warm, cases = prefix_groups(gap_s=1.0, per_group=1)
    run_single("vllm", [warm] + [c.request for c in cases], num_blocks=2048, caching=False)
    assert all(c.request.prefix_hit_tokens == 0 for c in cases)
