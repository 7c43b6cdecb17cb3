"""The dynamic-limit lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import ENGINE, QUICK, RATE, RUNNER, SEED, TOKENS
from workbench.ranges import Num, Spec


@dataclass(slots=True)
class DynamicLimitParams:
    quick: bool = False  # 24 s of traffic and one seed instead of 48 s and two
    seed: int = 0
    rate: float = 8.0  # req/s
    prompt_len: int = 1024
    output_len: int = 256
    chunk_s: float = 0.5  # simulated seconds stepped between looks at the control plane
    engine: str = "vllm"  # sim-vllm on sim, a real vLLM on host/gpu; sglang: gpu only
    runner: str | None = None  # a real vLLM's model runner: v1, v2 (None: as its env picks)
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "rate": RATE, "prompt_len": TOKENS, "output_len": TOKENS,
        "chunk_s": Num(float, 0.01, 60.0, "s"),
        "runner": RUNNER, "engine": ENGINE("sim-vllm", "server"),
    }
