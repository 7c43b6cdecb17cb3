"""The store-routes lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import GBPS, GPU, MODEL, QUICK, REPEATS, SEED, TOKENS
from workbench.ranges import Num, Opt, Spec


@dataclass(slots=True)
class StoreRoutesParams:
    quick: bool = False  # 2 seeds instead of 3
    seed: int = 0
    repeats: int | None = None
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    doc_len: int = 2048
    question_len: int = 64
    output_len: int = 4
    docs: int = 6  # documents written in miss / warm / pressure
    hot_docs: int = 2
    hot_reads: int = 12
    store_docs: int = 4  # pressure: the store holds this many documents' chunks
    dram_docs: int = 8  # the cache layer's DRAM tier, in documents
    chunk_tokens: int = 256
    direct_chunk: int | None = None  # None: the same chunk as the cache layer
    meta_batch: int = 0  # keys per metadata request (0: one per lookup)
    direct_meta_batch: int | None = None
    remote_gbps: float = 5.0
    meta_ms: float = 0.3
    spacing_s: float = 0.5
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "repeats": REPEATS, "model": MODEL, "gpu": GPU,
        "doc_len": TOKENS, "question_len": TOKENS, "output_len": TOKENS,
        "docs": Num(int, 1, 1024), "hot_docs": Num(int, 0, 1024), "hot_reads": Num(int, 0, 10000),
        "store_docs": Num(int, 1, 1024), "dram_docs": Num(int, 0, 1024),
        "chunk_tokens": Num(int, 1, 32768, "tokens"),
        "direct_chunk": Opt(Num(int, 1, 32768, "tokens")), "meta_batch": Num(int, 0, 4096),
        "direct_meta_batch": Opt(Num(int, 0, 4096)), "remote_gbps": GBPS,
        "meta_ms": Num(float, 0.0, 60000.0, "ms"), "spacing_s": Num(float, 0.0, 3600.0, "s"),
    }
