"""A vLLM-like engine instance: block pool + V1-style scheduler + SimPy driver."""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from workbench.engines.block_pool import BlockPool
from workbench.engines.driver import EngineDriver
from workbench.engines.kvsetup import InstanceKV
from workbench.engines.steptime import StepTimeModel
from workbench.engines.vllm_sched import VLLMKVManager, VLLMScheduler


@dataclass(slots=True)
class VLLMOptions:
    max_num_seqs: int = 256  # vLLM's default
    max_num_batched_tokens: int = 2048  # V1 default token budget for the API server
    chunked_prefill: bool = True
    enable_prefix_caching: bool = False  # the colocation bench ran --no-enable-prefix-caching
    max_cached_tokens: int | None = None  # None: the pool config's bound
    max_model_len: int | None = None


class VLLMLikeEngine:
    def __init__(self, env: simpy.Environment, name: str, ikv: InstanceKV,
                 steptime: StepTimeModel, device, *, gpu: simpy.Resource | None = None,
                 options: VLLMOptions | None = None):
        o = options or VLLMOptions()
        self.name, self.ikv, self.options = name, ikv, o
        self.pool = BlockPool(ikv.kv, enable_caching=o.enable_prefix_caching,
                              max_cached_tokens=o.max_cached_tokens)
        self.scheduler = VLLMScheduler(
            VLLMKVManager(self.pool), name=name, max_num_seqs=o.max_num_seqs,
            max_num_batched_tokens=o.max_num_batched_tokens, chunked_prefill=o.chunked_prefill,
            max_model_len=o.max_model_len)
        self.driver = EngineDriver(env, self.scheduler, steptime, ikv.kv.device, ikv.kv, gpu=gpu)

    @property
    def kv(self):
        return self.ikv.kv
