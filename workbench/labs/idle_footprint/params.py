"""The idle-footprint lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import ENGINE, QUICK, SEED
from workbench.ranges import Spec


@dataclass(slots=True)
class IdleFootprintParams:
    quick: bool = False  # 500 requests instead of 2,500
    seed: int = 0
    # on sim the simulated vLLM-like and SGLang-like engines; on host/gpu two real elastic
    # vLLMs (cache unbounded, and under the adapter's LRU bound; idle_footprint.server)
    engine: str = "vllm"  # sim-vllm on sim, a real vLLM on host/gpu
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED,
        "engine": ENGINE("sim-vllm", "vllm"),
    }
