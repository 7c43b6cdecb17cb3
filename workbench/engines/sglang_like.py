"""An SGLang-like engine instance: radix cache + extend/decode scheduler + SimPy driver."""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from workbench.engines.driver import EngineDriver
from workbench.engines.kvsetup import InstanceKV
from workbench.engines.radix_cache import RadixCache
from workbench.engines.sglang_sched import SGLangScheduler
from workbench.engines.steptime import StepTimeModel


@dataclass(slots=True)
class SGLangOptions:
    max_num_seqs: int = 256
    max_prefill_tokens: int = 16384  # SGLang's default
    chunked_prefill_size: int = 8192
    enable_radix_cache: bool = True
    max_cached_tokens: int | None = None
    init_new_token_ratio: float = 0.7


class SGLangLikeEngine:
    def __init__(self, env: simpy.Environment, name: str, ikv: InstanceKV,
                 steptime: StepTimeModel, device, *, gpu: simpy.Resource | None = None,
                 options: SGLangOptions | None = None):
        o = options or SGLangOptions()
        self.name, self.ikv, self.options = name, ikv, o
        self.cache = RadixCache(ikv.kv, enable_caching=o.enable_radix_cache,
                                max_cached_tokens=o.max_cached_tokens)
        self.scheduler = SGLangScheduler(
            self.cache, name=name, max_num_seqs=o.max_num_seqs,
            max_prefill_tokens=o.max_prefill_tokens, chunked_prefill_size=o.chunked_prefill_size,
            init_new_token_ratio=o.init_new_token_ratio)
        self.driver = EngineDriver(env, self.scheduler, steptime, ikv.kv.device, ikv.kv, gpu=gpu)

    @property
    def kv(self):
        return self.ikv.kv
