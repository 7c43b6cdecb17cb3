"""The output-equality lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import ENGINE, MODEL, QUICK, RUNNER, SEED
from workbench.ranges import Spec


@dataclass(slots=True)
class OutputEqualityParams:
    quick: bool = False  # 4 prompts x 24 tokens, one seed; else 8 x 48, three seeds
    seed: int = 0  # prompt seed (the model's weights are seeded by the model config)
    model: str = "tiny"  # a mini-engine model (workbench.mini.model.get_config)
    engine: str = "mini"  # the mini engine; vllm / sglang (gpu): a real one, elastic vs stock
    runner: str | None = None  # a real vLLM's model runner: v1, v2 (None: as its env picks)
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "model": MODEL,
        "runner": RUNNER, "engine": ENGINE("mini", "server"),
    }
