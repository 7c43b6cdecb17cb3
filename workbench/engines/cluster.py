"""Several engine instances on one simulated GPU: the colocation setup (seed 000 §1, §14).

Memory: each instance holds its weights plus ``activation_bytes`` (vLLM's profiled peak
activations, non-torch memory and CUDA-graph pool) outside any KV pool. Then

* ``static``: each instance's KV split is ``gpu_memory_utilization * capacity - weights -
  activations`` (vLLM's rule), a fixed pool (see :mod:`workbench.engines.kvsetup`);
* ``elastic``: every pool maps pages on demand from the one device, keeping
  ``1 - kv_gpu_utilization`` of it free (kvcached's ``gpu_utilization``).

Compute: instances time-slice the GPU at step granularity (``shared_gpu``), so an instance
decoding a trickle of requests still streams its weights every step and slows the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import simpy

from workbench.config import PoolConfig
from workbench.engines.driver import sample_memory
from workbench.engines.kvsetup import elastic_pool, static_pool
from workbench.engines.metrics import SLO, MemorySample, Summary, summarize
from workbench.engines.models import get_model
from workbench.engines.request import Request
from workbench.engines.sglang_like import SGLangLikeEngine, SGLangOptions
from workbench.engines.steptime import GPUS, StepTimeModel
from workbench.engines.vllm_like import VLLMLikeEngine, VLLMOptions
from workbench.errors import ConfigError
from workbench.sim.device import SimDevice

GiB = 1 << 30


@dataclass(slots=True)
class ClusterConfig:
    mode: str = "elastic"  # "static" | "elastic"
    engine: str = "vllm"  # "vllm" | "sglang"
    model: str = "llama-3.1-8b"
    gpu: str = "a100"  # step-time and VMM-latency preset
    num_instances: int = 3
    gpu_memory_utilization: float = 0.31  # static split per instance
    kv_gpu_utilization: float = 0.95  # elastic: keep 5% of the device free
    # 2.2 GiB makes the static split hold ~62k tokens of Llama-3.1-8B, matching the bench's
    # --max-model-len 62000 (vLLM refuses a max-model-len its KV cannot hold); an inference.
    activation_bytes: int = int(2.2 * GiB)
    shared_gpu: bool = True
    pool: PoolConfig = field(default_factory=PoolConfig)  # elastic: prealloc on, reserve 5..10
    vllm: VLLMOptions = field(default_factory=VLLMOptions)
    sglang: SGLangOptions = field(default_factory=SGLangOptions)
    steptime: dict = field(default_factory=dict)  # StepTimeModel overrides
    sample_every_s: float = 0.5
    slo: SLO = SLO()
    seed: int = 0


class InstanceResult(NamedTuple):
    name: str
    summary: Summary
    stats: dict
    kv_capacity_tokens: int
    held_bytes: int | None
    steps: int
    vmm_s: float
    requests: list[Request]


class ClusterResult(NamedTuple):
    config: ClusterConfig
    instances: list[InstanceResult]
    overall: Summary
    memory: list[MemorySample]
    sim_s: float
    wall_s: float
    cpu_s: float  # process CPU time: a rate that other load on the host does not skew

    @property
    def sim_per_wall(self) -> float:
        return self.sim_s / self.wall_s if self.wall_s else float("inf")


def build_cluster(cfg: ClusterConfig, env: simpy.Environment):
    if cfg.mode not in ("static", "elastic"):
        raise ConfigError(f"mode={cfg.mode!r}", "unknown", "use 'static' or 'elastic'")
    if cfg.engine not in ("vllm", "sglang"):
        raise ConfigError(f"engine={cfg.engine!r}", "unknown", "use 'vllm' or 'sglang'")
    model = get_model(cfg.model)
    spec = GPUS[cfg.gpu]
    device = SimDevice(cfg.gpu, env=env, capacity=spec.memory_bytes)
    for i in range(cfg.num_instances):
        device.occupy(f"inst{i}.weights+act", model.weight_bytes + cfg.activation_bytes)
    gpu = simpy.Resource(env, capacity=1) if cfg.shared_gpu else None
    st = StepTimeModel.preset(model, cfg.gpu, **cfg.steptime)
    pool_cfg = cfg.pool
    if cfg.mode == "elastic":
        from dataclasses import replace

        pool_cfg = replace(pool_cfg, gpu_utilization=cfg.kv_gpu_utilization)
    engines = []
    for i in range(cfg.num_instances):
        name = f"{cfg.engine}{i}"
        if cfg.mode == "static":
            kv_bytes = int(cfg.gpu_memory_utilization * spec.memory_bytes) - \
                model.weight_bytes - cfg.activation_bytes
            ikv = static_pool(model, kv_bytes, name=name, config=pool_cfg, env=env)
        else:
            ikv = elastic_pool(model, device, name=name, config=pool_cfg)
        if cfg.engine == "vllm":
            eng = VLLMLikeEngine(env, name, ikv, st, device, gpu=gpu, options=cfg.vllm)
        else:
            eng = SGLangLikeEngine(env, name, ikv, st, device, gpu=gpu, options=cfg.sglang)
        engines.append(eng)
    return device, engines


def run_cluster(cfg: ClusterConfig, workloads: list[list[Request]]) -> ClusterResult:
    """Run one workload per instance until every request finished (or was rejected)."""
    if len(workloads) != cfg.num_instances:
        raise ConfigError(f"{len(workloads)} workloads", f"for {cfg.num_instances} instances",
                          "pass one request list per instance")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    env = simpy.Environment()
    device, engines = build_cluster(cfg, env)
    total = sum(len(w) for w in workloads)
    for eng, reqs in zip(engines, workloads, strict=False):
        eng.driver.submit(reqs)
    memory: list[MemorySample] = []
    pools = {e.name: e.kv for e in engines}

    def done() -> bool:
        return sum(len(e.scheduler.finished) for e in engines) >= total

    def watch():
        while not done():
            yield env.timeout(0.25)

    env.process(sample_memory(env, pools, memory, cfg.sample_every_s))
    env.run(until=env.process(watch()))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    results = []
    for eng, reqs in zip(engines, workloads, strict=False):
        kv = eng.kv
        results.append(InstanceResult(
            eng.name, summarize(reqs, cfg.slo), eng.scheduler.stats.as_dict(),
            kv.geometry.num_slots, eng.ikv.held_bytes, eng.driver.steps, eng.driver.vmm_s, reqs))
    overall = summarize([r for w in workloads for r in w], cfg.slo)
    return ClusterResult(cfg, results, overall, memory, env.now, wall, cpu)
