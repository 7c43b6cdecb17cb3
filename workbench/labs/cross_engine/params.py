"""The cross-engine lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import (
    ENGINE,
    GIB,
    GPU,
    MODEL,
    QUICK,
    RATE,
    REPEATS,
    SECONDS,
    SEED,
    TOKENS,
)
from workbench.ranges import Num, Spec


@dataclass(slots=True)
class CrossEngineParams:
    quick: bool = False  # 2 seeds instead of 3
    seed: int = 0
    repeats: int | None = None
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    kv_budget_gib: float = 6.0
    phase_s: float = 15.0
    peak_rate: float = 3.0
    warm_rate: float = 1.0  # stage 6 warm-up: fills the caches without contention
    prompt_len: int = 1024
    output_len: int = 256
    big_bound: int = 32768  # stage 6: cached-token bounds, the big one and the small one
    small_bound: int = 2048
    engine: str = "sim"  # old spelling of sim-vllm+sim-sglang; real: vllm+sglang (gpu)
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "repeats": REPEATS, "model": MODEL, "gpu": GPU,
        "kv_budget_gib": GIB, "phase_s": SECONDS, "peak_rate": RATE, "warm_rate": RATE,
        "prompt_len": TOKENS, "output_len": TOKENS,
        "big_bound": Num(int, 1, 10_000_000, "tokens"),
        "small_bound": Num(int, 1, 10_000_000, "tokens"),
        "engine": ENGINE("sim-vllm+sim-sglang", "vllm+sglang"),
    }
