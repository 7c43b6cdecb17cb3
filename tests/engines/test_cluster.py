from __future__ import annotations

from workbench.engines.metrics import SLO, summarize
from workbench.engines.models import MODELS
from workbench.engines.sim.cluster import ClusterConfig, run_cluster
from workbench.engines.sim.steptime import StepTimeModel
from workbench.engines.sim.workloads import (
    long_short_mix,
    poisson,
    prefix_heavy,
    ramp_arrivals,
    ramp_delay,
    ramp_trace,
)


def test_ramp_trace_follows_kvcached_rules():
    peak = 12
    assert ramp_delay(peak) == 27.0
    for i in range(3):
        t = ramp_arrivals(peak, i)
        assert len(t) == peak * peak + (3 - i) * 27
        assert t[0] == i * 27.0 and t == sorted(t)
        first_sec = [x for x in t if i * 27 <= x < i * 27 + 1]
        peak_sec = [x for x in t if i * 27 + peak - 1 <= x < i * 27 + peak]
        assert len(first_sec) == 1 and len(peak_sec) == peak
    reqs = ramp_trace(peak, 1)
    assert {len(r.prompt) for r in reqs} == {256} and {r.max_new_tokens for r in reqs} == {256}


def test_workloads_are_seeded():
    for make in (lambda s: poisson(5.0, 20, seed=s), lambda s: long_short_mix(5.0, 20, seed=s),
                 lambda s: prefix_heavy(20, seed=s), lambda s: ramp_trace(12, 0, seed=s)):
        a, b, c = make(1), make(1), make(2)
        assert [(r.arrival, r.prompt, r.max_new_tokens) for r in a] == \
            [(r.arrival, r.prompt, r.max_new_tokens) for r in b]
        assert [r.prompt for r in a] != [r.prompt for r in c]


def test_long_short_mix_classes():
    reqs = long_short_mix(10.0, 300, seed=0)
    groups = {r.group for r in reqs}
    assert groups == {"short", "long_in", "long_out"}
    for r in reqs:
        assert (len(r.prompt), r.max_new_tokens) in ((128, 128), (4096, 128), (128, 1024))


def test_step_time_roofline():
    st = StepTimeModel.preset("llama-3.1-8b", "a100")
    one = st.step_time(1, 1, 256, 257)
    big = st.step_time(128, 128, 128 * 384, 128 * 385)
    assert 0.008 < one < 0.02  # weights-bound decode: ~16 GB / (0.8 * 2 TB/s) + overhead
    assert big > one
    prefill = st.cost(1, 4096, 0, 4096 * 4097 / 2)
    assert prefill.gpu_s > st.cost(1, 1, 4096, 4097).gpu_s  # compute-bound
    assert StepTimeModel.preset("llama-3.1-8b", "h200").step_time(1, 1, 256, 257) < one
    mla = StepTimeModel.preset("deepseek-v2-lite", "h100")
    assert MODELS["deepseek-v2-lite"].kv_bytes_per_token == 27 * 576 * 2
    assert mla.step_time(1, 1, 100, 101) > 0
    assert StepTimeModel.preset("qwen3-8b", "a100", bw_eff=0.5).bw_eff == 0.5


def _one_busy(mode: str, n: int = 150):
    """Instance 0 gets a burst; the other two idle."""
    cfg = ClusterConfig(mode=mode, sample_every_s=0.5)
    wl = [poisson(400.0, n, prompt_len=1024, output_len=256, seed=4), [], []]
    return run_cluster(cfg, wl)


def test_static_vs_elastic_capacity():
    s, e = _one_busy("static"), _one_busy("elastic")
    cap_s, cap_e = s.instances[0].kv_capacity_tokens, e.instances[0].kv_capacity_tokens
    assert 55_000 < cap_s < 70_000 and cap_e > 3 * cap_s
    peak_e = max(m.mapped_bytes for m in e.memory if m.instance == "vllm0")
    assert peak_e > s.instances[0].held_bytes  # the busy elastic instance outgrows a split
    assert e.overall.preemptions < s.overall.preemptions
    assert e.overall.ttft.mean < s.overall.ttft.mean
    # idle elastic instances map only the null block's page and their reserve
    idle = [m.mapped_bytes for m in e.memory if m.instance == "vllm2"]
    assert max(idle) <= 6 * 128 * (1 << 20)
    assert e.instances[0].vmm_s > 0 and s.instances[0].vmm_s == 0


def test_same_seed_same_result():
    a, b = _one_busy("elastic", 60), _one_busy("elastic", 60)
    key = lambda res: [(r.rid, r.first_token, r.finish, r.preemptions)  # noqa: E731
                       for i in res.instances for r in i.requests]
    assert key(a) == key(b)
    assert a.memory == b.memory
    assert a.overall == b.overall


def test_summary_and_goodput():
    cfg = ClusterConfig(mode="elastic", num_instances=1)
    res = run_cluster(cfg, [poisson(5.0, 30, prompt_len=128, output_len=32, seed=0)])
    s = res.overall
    assert s.finished == 30 and s.ttft.p50 <= s.ttft.p95 <= s.ttft.p99
    assert s.itl.n == 30 * 31
    strict = summarize(res.instances[0].requests, SLO(ttft_s=1e-6, tpot_s=1e-6))
    assert strict.goodput_req_per_s == 0 and s.goodput_req_per_s > 0
    assert res.sim_per_wall > 1


def test_sglang_cluster_static_vs_elastic():
    def run(mode):
        cfg = ClusterConfig(mode=mode, engine="sglang")
        wl = [poisson(400.0, 120, prompt_len=1024, output_len=256, seed=5), [], []]
        return run_cluster(cfg, wl)

    s, e = run("static"), run("elastic")
    assert s.overall.finished == e.overall.finished == 120
    assert s.overall.preemptions > 0 and e.overall.preemptions == 0  # retracts only when static
    assert e.overall.ttft.mean < s.overall.ttft.mean
