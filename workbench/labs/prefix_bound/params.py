"""The prefix-bound lab's parameters and their declared ranges (below its runners and
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
    SECONDS,
    SEED,
    TOKENS,
)
from workbench.ranges import Num, Spec


@dataclass(slots=True)
class PrefixBoundParams:
    quick: bool = False  # 2 seeds instead of 3
    seed: int = 0
    repeats: int | None = None
    engine: str = "vllm"  # sim-vllm (automatic prefix caching) or sim-sglang (radix cache)
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    bounded: int = 8192  # N, the bounded setting (tokens)
    rate: float = 4.0  # req/s of the mixed traffic
    traffic_s: float = 30.0
    idle_s: float = 10.0
    prefix_len: int = 2048
    suffix_len: int = 128
    output_len: int = 64
    num_prefixes: int = 4
    num_repeat_prompts: int = 8
    doc_len: int = 1024  # groups A-D
    probes_per_group: int = 4
    doc_bound: int = 512  # groups A-D also run with this bound, smaller than the document
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "repeats": REPEATS, "engine": ENGINE("simulated"),
        "model": MODEL, "gpu": GPU, "bounded": Num(int, 1, 10_000_000, "tokens"),
        "rate": RATE, "traffic_s": SECONDS, "idle_s": Num(float, 0.0, 3600.0, "s"),
        "prefix_len": TOKENS, "suffix_len": TOKENS, "output_len": TOKENS,
        "num_prefixes": Num(int, 1, 1024), "num_repeat_prompts": Num(int, 0, 1024),
        "doc_len": TOKENS, "probes_per_group": Num(int, 1, 1024),
        "doc_bound": Num(int, 1, 10_000_000, "tokens"),
    }
