"""The pd-split lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.engines.models import MODELS
from workbench.labs.kit.params import GBPS, GPU, LONG_SHARES, QUICK, RATE, RATES, REQUESTS, SEED
from workbench.ranges import Choice, Ints, Num, Spec


@dataclass(slots=True)
class PDSplitParams:
    rates: tuple[float, ...] = (2.0, 4.0, 6.0, 8.0)  # req/s of the whole mix
    long_shares: tuple[float, ...] = (0.1, 0.25, 0.5)
    num_requests: int = 300  # per mode, rate, share and repeat
    repeats: int = 2
    prefill: int = 1  # PD's prefill instances; colocated runs prefill + decode instances
    decode: int = 1
    link_gbps: float = 25.0  # GB/s (assumed: a 200 Gb/s NIC's line rate)
    link_latency_us: float = 50.0
    gpu: str = "a100"
    ratio_gpus: int = 4  # the P:D ratio step: every split of this many GPUs (0: skip it)
    ratio_rate: float = 8.0  # req/s for the ratio step
    seed: int = 0
    quick: bool = False  # shares 0.1 and 0.5 at 1 and 4 req/s, 150 requests, one repeat
    # host/gpu (the real handover): GPUs (2: prefill on GPU 0, decode on GPU 1; 1: both on one)
    gpus: int = 2
    real_model: str = ""  # "": tiny on host, llama-3.1-8b on gpu
    real_prompt_lens: tuple[int, ...] = (100, 1000, 4000)  # one request each (quick: 100, 1000)
    real_max_tokens: int = 16
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "rates": RATES, "long_shares": LONG_SHARES, "num_requests": REQUESTS,
        "repeats": Num(int, 1, 20), "prefill": Num(int, 1, 16), "decode": Num(int, 1, 16),
        "link_gbps": GBPS, "link_latency_us": Num(float, 0.0, 1e6, "us"), "gpu": GPU,
        "ratio_gpus": Num(int, 0, 16), "ratio_rate": RATE, "seed": SEED, "quick": QUICK,
        "gpus": Num(int, 1, 2), "real_model": Choice(("", *MODELS)),
        "real_prompt_lens": Ints(1, 32768), "real_max_tokens": Num(int, 1, 4096, "tokens"),
    }
