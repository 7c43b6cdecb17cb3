"""The tiered-retrieval lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import GBPS, GPU, MODEL, QUICK, REPEATS, SEED, TOKENS
from workbench.ranges import Choice, Floats, Ints, Num, Spec
from workbench.tiers.presets import PRESETS


@dataclass(slots=True)
class TieredRetrievalParams:
    quick: bool = False  # 2 seeds instead of 3
    seed: int = 0
    repeats: int | None = None
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    doc_len: int = 4096
    question_len: int = 64
    output_len: int = 8
    probes: int = 6
    chunk_tokens: int = 256
    remote_gbps: float = 5.0  # store transfer path, GB/s
    pcie_gbps: float = 25.0  # pinned host <-> HBM, GB/s
    meta_ms: float = 0.3  # one metadata request to the store's master
    sweep_lens: tuple[int, ...] = (128, 512, 2048, 8192)
    sweep_chunks: tuple[int, ...] = (64, 256, 1024)
    sweep_gbps: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 5.0, 25.0)
    sweep_concurrency: tuple[int, ...] = (1, 4, 8)  # probes arriving at once
    # tier cost preset (workbench.tiers.presets.PRESETS): "assumed", or "h200-measured" for the
    # host-to-device copy costs measured on an H200 (pcie_gbps is then ignored)
    costs: str = "assumed"
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "repeats": REPEATS, "model": MODEL, "gpu": GPU,
        "doc_len": TOKENS, "question_len": TOKENS, "output_len": TOKENS,
        "probes": Num(int, 1, 1024), "chunk_tokens": Num(int, 1, 32768, "tokens"),
        "remote_gbps": GBPS, "pcie_gbps": GBPS, "meta_ms": Num(float, 0.0, 60000.0, "ms"),
        "sweep_lens": Ints(1, 32768), "sweep_chunks": Ints(1, 32768),
        "sweep_gbps": Floats(0.01, 10000.0, 16, "GB/s"), "sweep_concurrency": Ints(1, 1024),
        "costs": Choice(tuple(PRESETS)),
    }
