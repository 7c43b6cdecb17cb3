"""The baseline lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import ENGINE, GPU, MODEL, QUICK, RATES, REQUESTS, SEED
from workbench.labs.kit.serving import WORKLOADS
from workbench.ranges import Choice, Num, Opt, Spec


@dataclass(slots=True)
class BaselineParams:
    workload: str = "mix"  # short | long_in | long_out | mix (seed 003 E1's loads)
    rates: tuple[float, ...] | None = None  # req/s; None: the workload's default sweep
    num_requests: int = 600  # per rate and repeat (p99 needs hundreds, seed 003 §2.8)
    repeats: int = 2  # workload seeds seed, seed+1, ...; rate order alternates
    seed: int = 0
    engine: str = "vllm"  # old spelling of sim-vllm here (sim-sglang: the SGLang-like one)
    model: str = "llama-3.1-8b"
    gpu: str = "a100"
    slo_ttft_s: float = 1.0
    slo_tpot_s: float = 0.1
    stable_attainment: float = 0.9
    saturation_ratio: float = 0.9
    quick: bool = False  # 400 requests, one repeat, every other rate
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "workload": Choice(WORKLOADS), "rates": Opt(RATES), "num_requests": REQUESTS,
        "repeats": Num(int, 1, 20), "seed": SEED, "engine": ENGINE("simulated"),
        "model": MODEL, "gpu": GPU, "slo_ttft_s": Num(float, 0.001, 600.0, "s"),
        "slo_tpot_s": Num(float, 0.0001, 60.0, "s"),
        "stable_attainment": Num(float, 0.01, 1.0), "saturation_ratio": Num(float, 0.01, 1.0),
        "quick": QUICK,
    }
