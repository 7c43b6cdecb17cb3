"""The grow-reclaim lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import (
    ENGINE,
    GPU,
    MODEL,
    QUICK,
    RATE,
    REPEATS,
    RUNNER,
    SECONDS,
    SEED,
    TOKENS,
)
from workbench.ranges import Num, Spec


@dataclass(slots=True)
class GrowReclaimParams:
    quick: bool = False  # 2 seeds instead of 4
    seed: int = 0  # the first seed; repeats use seed, seed+1, ...
    repeats: int | None = None  # None: 2 (quick) or 4
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    phase_s: float = 10.0  # each phase's length (simulated seconds)
    short_rate: float = 4.0  # req/s in the short phases
    short_len: int = 128  # prompt and output tokens of a short request
    long_rate: float = 2.0
    long_prompt: int = 4096
    long_output: int = 512
    min_reserved_pages: int = 5
    max_reserved_pages: int = 10
    # on sim the simulated vLLM-like engine (every field above); on host/gpu a real vLLM with
    # the tiny model, its own phases and a 1..2-page reserve (grow_reclaim.server)
    engine: str = "vllm"  # sim-vllm on sim, a real vLLM on host/gpu; sglang: gpu only
    runner: str | None = None  # a real vLLM's model runner: v1, v2 (None: as its env picks)
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "repeats": REPEATS, "model": MODEL, "gpu": GPU,
        "phase_s": SECONDS, "short_rate": RATE, "short_len": TOKENS, "long_rate": RATE,
        "long_prompt": TOKENS, "long_output": TOKENS,
        "min_reserved_pages": Num(int, 0, 10000, "pages"),
        "max_reserved_pages": Num(int, 0, 10000, "pages"),
        "runner": RUNNER, "engine": ENGINE("sim-vllm", "server"),
    }
