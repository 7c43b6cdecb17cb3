"""The no-fake-enable lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import ENGINE, QUICK, RATE, SEED, TOKENS
from workbench.ranges import Spec


@dataclass(slots=True)
class NoFakeEnableParams:
    quick: bool = False  # one seed and 24 requests per arm instead of three seeds and 64
    seed: int = 0
    rate: float = 8.0  # burst arrival rate, req/s
    prompt_len: int = 2048
    output_len: int = 128
    engine: str = "vllm"  # sim-vllm on sim, a real vLLM on host/gpu
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "rate": RATE, "prompt_len": TOKENS, "output_len": TOKENS,
        "engine": ENGINE("sim-vllm", "vllm"),
    }
