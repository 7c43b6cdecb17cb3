"""The seams every vLLM plan shares (``plan26.py``, ``plan.py``, ``plan34.py``): module names,
the block pool's common check and the patches whose target did not move between releases. A plan
adds the checks that pin its own release's seams; no plan imports another."""

from __future__ import annotations

from types import ModuleType

from workbench.adapters.patching import (
    need_attrs,
    need_params,
    need_source,
    replace_class,
    wrap_method,
)
from workbench.adapters.registry import Patch

POOL = "vllm.v1.core.block_pool"
MGR = "vllm.v1.core.kv_cache_manager"
WORKER_UTILS = "vllm.v1.worker.utils"
GPU_WORKER = "vllm.v1.worker.gpu_worker"
ENGINE_CORE = "vllm.v1.engine.core"


def check_pool(m: ModuleType, *params: str) -> str | None:
    """``BlockPool`` with the methods ``ElasticBlockPool`` overrides, the constructor
    parameters it passes through (``params``: a release's own), and the free queue it walks."""
    cls = getattr(m, "BlockPool", None)
    if cls is None:
        return f"{POOL} has no BlockPool"
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    return (need_attrs(cls, "get_new_blocks", "free_blocks", "touch", "get_num_free_blocks",
                       "_maybe_evict_cached_block", "reset_prefix_cache", "evict_blocks")
            or need_params(cls.__init__, "num_gpu_blocks", "enable_caching", "hash_block_size",
                           *params)
            or need_attrs(FreeKVCacheBlockQueue([]), "fake_free_list_head",
                          "fake_free_list_tail", "remove", "append_n"))


def apply_pool(m: ModuleType):
    from workbench.adapters.vllm.pool import ElasticBlockPool

    return replace_class(m, "BlockPool", ElasticBlockPool, "vllm")


def check_mgr(m: ModuleType) -> str | None:
    cls = getattr(m, "KVCacheManager", None)
    return f"{MGR} has no KVCacheManager" if cls is None else need_attrs(cls, "allocate_slots")


def apply_mgr(m: ModuleType):
    from workbench.adapters.vllm.pool import allocate_slots_or_none

    return wrap_method(m.KVCacheManager, "allocate_slots", allocate_slots_or_none)


POOL_DOC = "BlockPool -> ElasticBlockPool (vLLM's prefix caching kept; pages follow held blocks)"
MGR_DOC = "KVCacheManager.allocate_slots: a failed page map is None (preempt), not a crash"


def check_idle(m: ModuleType) -> str | None:
    """The engine-core loop that, with no request in flight, notifies its idle callbacks before
    it blocks on its input queue (vLLM 0.24 on)."""
    cls = getattr(m, "EngineCoreProc", None)
    if cls is None:
        return f"{ENGINE_CORE} has no EngineCoreProc"
    return (need_attrs(cls, "_notify_idle_state_callbacks", "_process_input_queue")
            or need_source(cls._process_input_queue, "self._notify_idle_state_callbacks()",
                           "self.has_work()"))


def apply_idle(m: ModuleType):
    from workbench.adapters.vllm import registry

    def make(orig):
        def _notify_idle_state_callbacks(self):
            registry.tidy_idle()
            orig(self)

        return _notify_idle_state_callbacks

    return wrap_method(m.EngineCoreProc, "_notify_idle_state_callbacks", make)


def idle_patch(versions: str, fix: str) -> Patch:
    """Optional: where the loop moved, the pool releases and refills on the request path, as
    it did before (vLLM with the engine core in the caller's process has no such loop)."""
    return Patch("idle-tidy", ENGINE_CORE, versions, apply_idle, check_idle, required=False,
                 fix=fix, doc="EngineCoreProc, idle: every elastic pool releases its retired "
                 "pages and refills its reserve before the loop waits for work, not on the next "
                 "request's path")


def check_step(m: ModuleType) -> str | None:
    """The worker's two-phase step: ``execute_model`` launches the forward pass and returns,
    then ``sample_tokens`` waits for it through the model runner (vLLM 0.26 on)."""
    cls = getattr(m, "Worker", None)
    if cls is None:
        return f"{GPU_WORKER} has no Worker"
    return (need_attrs(cls, "execute_model", "sample_tokens")
            or need_source(cls.sample_tokens, "self.model_runner.sample_tokens("))


def apply_step(m: ModuleType):
    from workbench.adapters.vllm import registry

    def make(orig):
        def sample_tokens(self, *args, **kwargs):
            registry.refill_in_step()
            return orig(self, *args, **kwargs)

        return sample_tokens

    return wrap_method(m.Worker, "sample_tokens", make)


def step_patch(versions: str, fix: str) -> Patch:
    """Optional: where the step is one call again, the reserve refills inline or at idle."""
    return Patch("step-refill", GPU_WORKER, versions, apply_step, check_step, required=False,
                 fix=fix, doc="Worker.sample_tokens: every elastic pool of the process refills "
                 "its reserve while the step's forward pass runs on the GPU, before the worker "
                 "waits for its tokens, not inside the next allocation")
