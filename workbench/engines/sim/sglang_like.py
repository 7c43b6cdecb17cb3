"""An SGLang-like engine instance: radix cache + extend/decode scheduler + SimPy driver."""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from workbench.engines.sched.radix_cache import RadixCache
from workbench.engines.sched.sglang_sched import SGLangScheduler
from workbench.engines.sim.engine import SimEngine
from workbench.engines.sim.kvsetup import InstanceKV
from workbench.engines.sim.steptime import StepTimeModel


@dataclass(slots=True)
class SGLangOptions:
    max_num_seqs: int = 256
    max_prefill_tokens: int = 16384  # SGLang's default
    chunked_prefill_size: int = 8192
    enable_radix_cache: bool = True
    max_cached_tokens: int | None = None
    init_new_token_ratio: float = 0.7


class SGLangLikeEngine(SimEngine):
    kind = "sglang"

    def __init__(self, env: simpy.Environment, name: str, ikv: InstanceKV,
                 steptime: StepTimeModel, *, gpu: simpy.Resource | None = None,
                 options: SGLangOptions | None = None, sample_every_s: float | None = None,
                 host: str = "parallel"):
        self.options = options or SGLangOptions()
        self.cache = RadixCache(ikv.kv, enable_caching=self.options.enable_radix_cache,
                                max_cached_tokens=self.options.max_cached_tokens)
        super().__init__(env, name, ikv, steptime, gpu=gpu, sample_every_s=sample_every_s,
                         host=host)

    def _scheduler(self) -> SGLangScheduler:
        o = self.options
        return SGLangScheduler(
            self.cache, name=self.name, max_num_seqs=o.max_num_seqs,
            max_prefill_tokens=o.max_prefill_tokens, chunked_prefill_size=o.chunked_prefill_size,
            init_new_token_ratio=o.init_new_token_ratio)
