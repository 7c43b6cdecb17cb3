"""The kv-capacity lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.engines.models import MODELS
from workbench.labs.kit.params import ENGINE, QUICK, SEED
from workbench.ranges import Choices, Floats, Ints, Num, Spec


@dataclass(slots=True)
class KVCapacityParams:
    models: tuple[str, ...] = ("llama-3.1-8b", "qwen3-8b", "deepseek-v2-lite")
    mem_gib: tuple[float, ...] = (24.0, 48.0, 80.0, 141.0)  # device sizes
    block_sizes: tuple[int, ...] = (16, 32)
    layouts: tuple[str, ...] = ("contiguous", "per_layer")
    gpu_memory_utilization: float = 0.9  # static split (vLLM's default)
    kv_gpu_utilization: float = 0.95  # elastic pool headroom (kvcached's default)
    activation_gib: float = 2.2  # profiled activations + CUDA graphs, outside the KV budget
    context_lens: tuple[int, ...] = (100, 1000, 4000, 16000)  # concurrency at fixed length
    concurrency: tuple[int, ...] = (4, 5, 6, 7, 8)  # preemption sweep (1000 in / 200 out)
    quick: bool = False  # llama + the MLA model, 80 GiB, block 16, both layouts
    seed: int = 0
    engine: str = "vllm"  # sim-vllm (simulated pools) on sim, a real vLLM on host/gpu
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "models": Choices(tuple(MODELS)), "mem_gib": Floats(1.0, 192.0, 16, "GiB"),
        "block_sizes": Ints(8, 1024), "layouts": Choices(("contiguous", "per_layer")),
        "gpu_memory_utilization": Num(float, 0.01, 1.0),
        "kv_gpu_utilization": Num(float, 0.01, 1.0),
        "activation_gib": Num(float, 0.0, 1024.0, "GiB"),
        "context_lens": Ints(1, 131072), "concurrency": Ints(1, 1024), "quick": QUICK,
        "seed": SEED,
        "engine": ENGINE("sim-vllm", "vllm"),
    }
