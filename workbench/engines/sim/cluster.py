"""Several engine instances on one simulated GPU: the colocation setup (seed 000 §1, §14).

Memory: each instance holds its weights plus ``activation_bytes`` (vLLM's profiled peak
activations, non-torch memory and CUDA-graph pool) outside any KV pool. Then

* ``static``: each instance's KV split is ``gpu_memory_utilization * capacity - weights -
  activations`` (vLLM's rule), a fixed pool (see :mod:`workbench.engines.sim.kvsetup`);
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
from workbench.engines.metrics import SLO, MemorySample, Summary, summarize
from workbench.engines.models import get_model
from workbench.engines.sched.request import Request
from workbench.engines.sim.engine import SimEngine
from workbench.engines.sim.kvsetup import elastic_pool, static_pool
from workbench.engines.sim.sglang_like import SGLangLikeEngine, SGLangOptions
from workbench.engines.sim.steptime import GPUS, StepTimeModel
from workbench.engines.sim.vllm_like import VLLMLikeEngine, VLLMOptions
from workbench.errors import ConfigError
from workbench.sim.device import SimDevice
from workbench.units import GiB


@dataclass(slots=True)
class ClusterConfig:
    mode: str = "elastic"  # "static" | "elastic"
    engine: str = "vllm"  # "vllm" | "sglang": the kind of every instance...
    kinds: tuple[str, ...] = ()  # ...unless given per instance: a mixed cluster
    model: str = "llama-3.1-8b"
    gpu: str = "a100"  # step-time and VMM-latency preset
    num_instances: int = 3
    gpu_memory_utilization: float = 0.31  # static split per instance
    kv_gpu_utilization: float = 0.95  # elastic: keep 5% of the device free
    kv_virtual_bytes: int | None = None  # elastic: each pool's virtual range (None: the device)
    # 2.2 GiB makes the static split hold ~62k tokens of Llama-3.1-8B, matching the bench's
    # --max-model-len 62000 (vLLM refuses a max-model-len its KV cannot hold); an inference.
    activation_bytes: int = int(2.2 * GiB)
    shared_gpu: bool = True
    host: str = "parallel"  # what a step's host part shares (engines.sim.driver.HOST_MODES)
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


SIM_ENGINES: dict[str, type[SimEngine]] = {"vllm": VLLMLikeEngine, "sglang": SGLangLikeEngine}


def instance_kinds(cfg: ClusterConfig) -> tuple[str, ...]:
    """Each instance's engine kind: ``cfg.kinds`` if given, else ``cfg.engine`` for all."""
    kinds = cfg.kinds or (cfg.engine,) * cfg.num_instances
    if len(kinds) != cfg.num_instances:
        raise ConfigError(f"kinds={kinds!r}", f"names {len(kinds)} engines for "
                          f"{cfg.num_instances} instances", "give one kind per instance")
    for k in kinds:
        if k not in SIM_ENGINES:
            raise ConfigError(f"engine={k!r}", "unknown", "use 'vllm' or 'sglang'")
    return kinds


def cluster_device(cfg: ClusterConfig, env: simpy.Environment) -> SimDevice:
    """The one simulated GPU the instances share: ``cfg.gpu``'s preset and memory on ``env``."""
    from workbench.sim.device import SimDevice

    return SimDevice(preset=cfg.gpu, env=env, capacity=GPUS[cfg.gpu].memory_bytes)


def build_cluster(cfg: ClusterConfig, env: simpy.Environment,
                  device: SimDevice | None = None) -> tuple[SimDevice, list[SimEngine]]:
    """The instances of ``cfg`` on ``device`` (a simulated GPU on ``env``; None: the one
    :func:`cluster_device` builds from ``cfg``)."""
    if cfg.mode not in ("static", "elastic"):
        raise ConfigError(f"mode={cfg.mode!r}", "unknown", "use 'static' or 'elastic'")
    kinds = instance_kinds(cfg)
    model = get_model(cfg.model)
    spec = GPUS[cfg.gpu]
    device = device if device is not None else cluster_device(cfg, env)
    for i in range(cfg.num_instances):
        device.occupy(f"inst{i}.weights+act", model.weight_bytes + cfg.activation_bytes)
    gpu = simpy.Resource(env, capacity=1) if cfg.shared_gpu else None
    st = StepTimeModel.preset(model, cfg.gpu, **cfg.steptime)
    pool_cfg = cfg.pool
    if cfg.mode == "elastic":
        from dataclasses import replace

        pool_cfg = replace(pool_cfg, gpu_utilization=cfg.kv_gpu_utilization)
    engines: list[SimEngine] = []
    for i, kind in enumerate(kinds):
        name = f"{kind}{i}"
        options = getattr(cfg, kind)  # the scheduler's options: cfg.vllm, cfg.sglang
        first = getattr(options, "kv_blocks_first", False)
        if cfg.mode == "static":
            kv_bytes = int(cfg.gpu_memory_utilization * spec.memory_bytes) - \
                model.weight_bytes - cfg.activation_bytes
            ikv = static_pool(model, kv_bytes, name=name, config=pool_cfg, env=env,
                              blocks_first=first,
                              num_blocks=getattr(options, "num_gpu_blocks_override", None))
        else:
            ikv = elastic_pool(model, device, name=name, config=pool_cfg,
                               virtual_bytes=cfg.kv_virtual_bytes, blocks_first=first)
        engines.append(SIM_ENGINES[kind](env, name, ikv, st, gpu=gpu, options=options,
                                         sample_every_s=cfg.sample_every_s, host=cfg.host))
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
        eng.submit(reqs)

    def watch():
        while sum(len(e.scheduler.finished) for e in engines) < total:
            yield env.timeout(0.25)

    env.run(until=env.process(watch()))
    # every instance samples its pool at the same instants: merge in (time, instance) order
    order = {e.name: i for i, e in enumerate(engines)}
    memory = sorted((s for e in engines for s in e.memory_timeline()),
                    key=lambda s: (s.t, order[s.instance]))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    results = []
    for eng, reqs in zip(engines, workloads, strict=False):
        kv = eng.kv
        results.append(InstanceResult(
            eng.name, eng.metrics(cfg.slo), eng.scheduler.stats.as_dict(),
            kv.geometry.num_slots, eng.ikv.held_bytes, eng.driver.steps, eng.driver.vmm_s, reqs))
    overall = summarize([r for w in workloads for r in w], cfg.slo)
    return ClusterResult(cfg, results, overall, memory, env.now, wall, cpu)
