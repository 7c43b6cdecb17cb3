"""A vLLM-like engine instance: block pool + V1-style scheduler + SimPy driver."""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from workbench.engines.sched.block_pool import BlockPool
from workbench.engines.sched.vllm_sched import KVConnector, VLLMKVManager, VLLMScheduler
from workbench.engines.sim.engine import SimEngine
from workbench.engines.sim.kvsetup import InstanceKV
from workbench.engines.sim.steptime import StepTimeModel


@dataclass(slots=True)
class VLLMOptions:
    max_num_seqs: int = 256  # vLLM's default
    max_num_batched_tokens: int = 2048  # V1 default token budget for the API server
    chunked_prefill: bool = True
    enable_prefix_caching: bool = False  # the colocation bench ran --no-enable-prefix-caching
    max_cached_tokens: int | None = None  # None: the pool config's bound
    max_model_len: int | None = None
    # vLLM V1's async scheduling: step N+1 is planned while step N runs, so an arrival waits
    # one step longer to be admitted (off: plan each step after the last one's output)
    async_scheduling: bool = False
    # the KV tensor's layout: False, K and V in separate buffers per layer (FlashAttention's
    # (2, blocks, ...)); True, blocks first with K and V inside each block (TRITON_ATTN's
    # (blocks, 2, ...)): one buffer per layer, so a page id spans half the bytes and blocks
    kv_blocks_first: bool = False
    # a static KV tensor of this many blocks (vLLM's num_gpu_blocks_override, null block
    # included) instead of whole page ids of its memory share (None)
    num_gpu_blocks_override: int | None = None


class VLLMLikeEngine(SimEngine):
    kind = "vllm"

    def __init__(self, env: simpy.Environment, name: str, ikv: InstanceKV,
                 steptime: StepTimeModel, *, gpu: simpy.Resource | None = None,
                 options: VLLMOptions | None = None, sample_every_s: float | None = None,
                 connector: KVConnector | None = None, host: str = "parallel"):
        self.options = options or VLLMOptions()
        # a KV tier connector (workbench.tiers.sim.TierConnector): the scheduler asks it at
        # admission, the driver charges its loads and saves
        self.connector = connector
        self.pool = BlockPool(ikv.kv, enable_caching=self.options.enable_prefix_caching,
                              max_cached_tokens=self.options.max_cached_tokens)
        super().__init__(env, name, ikv, steptime, gpu=gpu, sample_every_s=sample_every_s,
                         host=host)
        self.driver.connector = connector

    def _async_scheduling(self) -> bool:
        return self.options.async_scheduling

    def _scheduler(self) -> VLLMScheduler:
        o = self.options
        return VLLMScheduler(
            VLLMKVManager(self.pool), name=self.name, max_num_seqs=o.max_num_seqs,
            max_num_batched_tokens=o.max_num_batched_tokens, chunked_prefill=o.chunked_prefill,
            max_model_len=o.max_model_len, connector=self.connector)
