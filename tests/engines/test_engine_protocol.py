"""The Engine protocol on the simulated engines, and a cluster that mixes engine kinds."""

from __future__ import annotations

import pytest
import simpy

from workbench.engines.base import Engine
from workbench.engines.models import ALIASES, MODELS, get_model
from workbench.engines.sim.cluster import ClusterConfig, build_cluster, run_cluster
from workbench.engines.sim.workloads import poisson
from workbench.errors import ConfigError


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_sim_engine_speaks_the_protocol(kind):
    env = simpy.Environment()
    cfg = ClusterConfig(engine=kind, num_instances=1, sample_every_s=0.5)
    device, (eng,) = build_cluster(cfg, env)
    assert isinstance(eng, Engine) and eng.kind == kind and eng.name == f"{kind}0"
    assert eng.kv_pool is eng.kv and eng.kv_pool.device is device
    reqs = poisson(20.0, 12, prompt_len=64, output_len=8, seed=1)
    eng.submit(reqs)
    assert eng.has_work()
    eng.advance(0.05)
    assert env.now == pytest.approx(0.05)
    eng.advance()
    assert not eng.has_work() and eng.metrics().finished == 12
    assert {r.rid for r in eng.scheduler.finished} == {r.rid for r in reqs}
    times = [s.t for s in eng.memory_timeline()]
    assert times == sorted(times) and times[0] == 0.0 and len(times) >= 2
    assert max(s.used_blocks for s in eng.memory_timeline()) > 0


def test_cluster_mixes_a_vllm_like_and_an_sglang_like_instance_on_one_device():
    cfg = ClusterConfig(mode="elastic", kinds=("vllm", "sglang"), num_instances=2)
    env = simpy.Environment()
    device, engines = build_cluster(cfg, env)
    assert [e.kind for e in engines] == ["vllm", "sglang"]
    assert [e.name for e in engines] == ["vllm0", "sglang1"]
    assert all(e.kv_pool.device is device for e in engines)  # one device, two pools
    wl = [poisson(50.0, 40, prompt_len=512, output_len=64, seed=s) for s in (1, 2)]
    res = run_cluster(cfg, wl)
    assert [i.name for i in res.instances] == ["vllm0", "sglang1"]
    assert res.overall.finished == 80 and all(i.summary.finished == 40 for i in res.instances)
    seen = {m.instance for m in res.memory if m.mapped_bytes > 0}
    assert seen == {"vllm0", "sglang1"}


def test_cluster_refuses_kinds_that_do_not_fit():
    with pytest.raises(ConfigError, match="one kind per instance"):
        build_cluster(ClusterConfig(kinds=("vllm",), num_instances=2), simpy.Environment())
    with pytest.raises(ConfigError, match="unknown"):
        build_cluster(ClusterConfig(kinds=("vllm", "trt"), num_instances=2),
                      simpy.Environment())


def test_one_model_registry_with_one_name_per_model():
    assert get_model("llama3-8b") is MODELS["llama-3.1-8b"]  # the old mini name, an alias
    assert set(ALIASES.values()) <= set(MODELS)
    assert not set(ALIASES) & set(MODELS)
    tiny = MODELS["tiny"]
    assert tiny.decoder is not None and tiny.params == tiny.active_params
    assert tiny.kv_bytes_per_token == 2 * 2 * 2 * 32 * 2
    assert MODELS["deepseek-v2-lite"].decoder is None


def test_a_cluster_runs_on_the_device_it_is_given():
    from workbench.engines.sim.cluster import cluster_device

    cfg = ClusterConfig(num_instances=1, mode="elastic")
    env = simpy.Environment()
    given = cluster_device(cfg, env)
    device, (eng,) = build_cluster(cfg, env, given)
    assert device is given and eng.kv.device is given
