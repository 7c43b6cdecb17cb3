"""The vLLM-like engine's facts measured on real vLLM: the KV tensor's layout, static pools of
whole blocks, async scheduling's one-step later admission."""

from __future__ import annotations

from workbench.core.geometry import KVGeometry
from workbench.engines.models import get_model
from workbench.engines.sched.request import Request
from workbench.engines.sim.cluster import ClusterConfig, run_cluster
from workbench.engines.sim.kvsetup import static_pool
from workbench.engines.sim.vllm_like import VLLMOptions
from workbench.units import MiB


def test_blocks_first_halves_the_page_id():
    kw = dict(num_layers=32, kv_heads=8, head_dim=128, num_blocks=1024)
    split, first = KVGeometry.for_model(**kw), KVGeometry.for_model(blocks_first=True, **kw)
    assert split.page_id_bytes == 128 * MiB and first.page_id_bytes == 64 * MiB
    # the same bytes per block over all layers, half the blocks per page id
    assert split.block_bytes * 2 == first.block_bytes
    assert first.blocks_per_page(0) * 2 == split.blocks_per_page(0) == 64


def test_static_pool_of_whole_blocks_or_whole_page_ids():
    m = get_model("llama-3.1-8b")
    # the real lab's static third of 2 GiB: num_gpu_blocks_override 341
    ikv = static_pool(m, (2 << 30) // 3, name="s", blocks_first=True, num_blocks=341)
    assert ikv.kv.geometry.num_blocks == 341 and ikv.held_bytes == 341 * 2 * MiB
    # without it the split holds whole page ids: 10 of 64 MiB, 320 blocks
    floor = static_pool(m, (2 << 30) // 3, name="s", blocks_first=True)
    assert floor.kv.geometry.num_blocks == 320 and floor.held_bytes == 640 * MiB


def _one(async_scheduling: bool) -> float:
    cfg = ClusterConfig(mode="static", gpu="h200", num_instances=1, gpu_memory_utilization=0.2,
                        vllm=VLLMOptions(async_scheduling=async_scheduling))
    reqs = [Request(0, list(range(256)), 40, 0.0), Request(1, list(range(256)), 4, 0.1)]
    run_cluster(cfg, [reqs])
    return reqs[1].first_token - reqs[1].arrival


def test_async_scheduling_admits_an_arrival_one_step_later():
    # the second request arrives while the first decodes: planned one step later under async
    assert _one(True) > _one(False) > 0


def _two(**steptime) -> list[float]:
    cfg = ClusterConfig(mode="static", gpu="h200", num_instances=2, gpu_memory_utilization=0.2,
                        steptime=steptime)
    wl = [[Request(i, list(range(256)), 30, 0.0)] for i in range(2)]
    run_cluster(cfg, wl)
    return [w[0].finish for w in wl]


def test_the_gpus_turn_between_engines_costs_time():
    # two engines decoding side by side alternate on the GPU: every turn adds its cost
    assert min(_two(gpu_switch_s=1e-3)) > max(_two()) + 20e-3


def test_step_noise_is_seeded():
    a, b = _two(noise_sd=0.1, noise_seed=0), _two(noise_sd=0.1, noise_seed=1)
    assert a == _two(noise_sd=0.1, noise_seed=0) and a != b and a != _two()
