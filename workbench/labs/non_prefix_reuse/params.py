"""The non-prefix-reuse lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import GBPS, GPU, MODEL, QUICK, REPEATS, SEED, TOKENS
from workbench.ranges import Floats, Num, Spec


@dataclass(slots=True)
class NonPrefixReuseParams:
    quick: bool = False  # 2 seeds instead of 3
    seed: int = 0
    repeats: int | None = None
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    preamble_len: int = 256
    doc_len: int = 1024  # a multiple of chunk_tokens: documents sit on the chunk grid
    docs_per_prompt: int = 4
    pool_docs: int = 6
    question_len: int = 64
    chunk_tokens: int = 256
    recompute_ratio: float = 0.15
    sweep_ratios: tuple[float, ...] = (0.0, 0.05, 0.15, 0.3, 0.6, 1.0)
    pcie_gbps: float = 25.0
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "repeats": REPEATS, "model": MODEL, "gpu": GPU,
        "preamble_len": TOKENS, "doc_len": TOKENS, "docs_per_prompt": Num(int, 1, 64),
        "pool_docs": Num(int, 1, 1024), "question_len": TOKENS,
        "chunk_tokens": Num(int, 1, 32768, "tokens"), "recompute_ratio": Num(float, 0.0, 1.0),
        "sweep_ratios": Floats(0.0, 1.0), "pcie_gbps": GBPS,
    }
