"""A per-process virtual memory budget for vLLM on a GPU shared with other engines.

Stock vLLM sizes its KV cache from the GPU's *free* memory at start-up and refuses to start when
less than ``gpu_memory_utilization * total`` is free (``request_memory``). With elastic KV the
cache takes physical memory only as requests need it, so two engines on one GPU must both start:
each plans against its own virtual budget instead, and the device's headroom (and ``workbench
kvctl limit``) decides at run time who backs what.

    budget    = WORKBENCH_KV_VLLM_BUDGET (a size, e.g. 40GiB), else
                gpu_memory_utilization * total device memory (vLLM's own request)
    KV bytes  = budget - weights - activation peak

``weights`` is what the model runner loaded (``model_memory_usage``); the activation peak is
torch's allocated peak during vLLM's profile run above the weights. The KV bytes size vLLM's
block count, i.e. the ledger's *virtual* range; nothing is checked against free memory here.
"""

from __future__ import annotations

import math

import torch

from workbench.errors import ConfigError
from workbench.settings import settings

ENV = "WORKBENCH_KV_VLLM_BUDGET"


def budget_bytes(total: int, utilization: float) -> int:
    budget = settings().vllm_budget  # parsed and range-checked with every WORKBENCH_KV_* knob
    if budget is None:
        return math.ceil(total * utilization)
    if budget > total:
        raise ConfigError(f"{ENV}={budget}", f"is more than the device's {total} bytes",
                          f"set {ENV} to a size like 40GiB, or unset it")
    return budget


def kv_bytes(budget: int, weights: int, activation_peak: int) -> int:
    kv = budget - weights - activation_peak
    if kv <= 0:
        raise ConfigError(f"a virtual budget of {budget} bytes",
                          f"weights ({weights}) and the activation peak ({activation_peak}) "
                          "leave nothing for the KV cache", f"raise {ENV} or "
                          "gpu_memory_utilization, or lower max_num_batched_tokens")
    return kv


def make_request_memory(orig):
    """``request_memory(init_snapshot, cache_config)`` without the free-memory guard."""

    def request_memory(init_snapshot, cache_config):
        return budget_bytes(int(init_snapshot.total_memory), cache_config.gpu_memory_utilization)

    return request_memory


def make_determine_available_memory(orig, startup=None):
    """``Worker.determine_available_memory``: the profile run, then the formula above.
    ``startup``: the worker module's ``maybe_apply_startup_plan`` (run first, as stock does)."""

    def determine_available_memory(self):
        if self.cache_config.kv_cache_memory_bytes:  # the user sized the cache: stock path
            return orig(self)
        if startup is not None:
            startup(self)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.model_runner.profile_run()
        weights = int(self.model_runner.model_memory_usage)
        peak = int(torch.cuda.max_memory_allocated(self.device))
        activation = max(0, peak - weights)
        kv = kv_bytes(self.requested_memory, weights, activation)
        self.non_torch_memory, self.peak_activation_memory = 0, activation
        self.cudagraph_memory_estimate = 0
        self.available_kv_cache_memory_bytes = kv
        self.workbench_budget = {"budget": self.requested_memory, "weights": weights,
                                 "activation_peak": activation, "kv": kv}
        return kv

    return determine_available_memory
