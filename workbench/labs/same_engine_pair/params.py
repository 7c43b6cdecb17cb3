"""The same-engine-pair lab's parameters and their declared ranges (below its runners and
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
from workbench.ranges import Choice, Flag, Spec

DEFAULT_KIND = "vllm"  # the simulated pair's scheduler unless kind names another


@dataclass(slots=True)
class PairParams:
    quick: bool = False  # 2 repeats instead of 4
    seed: int = 0
    repeats: int | None = None
    kind: str = DEFAULT_KIND  # "vllm" or "sglang": both instances
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    kv_budget_gib: float = 6.0  # what the two pools may map together
    phase_s: float = 15.0
    peak_rate: float = 3.0  # req/s while an instance peaks
    prompt_len: int = 1024
    output_len: int = 256
    ipc_demo: bool = True  # the same vs separate IPC names part (real /dev/shm segments)
    engine: str = "vllm"  # sim-vllm (of ``kind``) on sim; two real vLLMs on host/gpu
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "repeats": REPEATS, "kind": Choice(("vllm", "sglang")),
        "model": MODEL, "gpu": GPU, "kv_budget_gib": GIB, "phase_s": SECONDS,
        "peak_rate": RATE, "prompt_len": TOKENS, "output_len": TOKENS, "ipc_demo": Flag(),
        "engine": ENGINE("sim-vllm", "server"),
    }
