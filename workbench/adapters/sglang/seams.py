"""The seams both SGLang plans share (``plan.py`` for 0.5.23, ``plan0516.py`` for 0.5.16): module
names, the fix both refusals name, and the patches whose target did not move between the two
releases (the elastic MHA/MLA pools, the forward-stream watch, the idle leak check, the charge
taken at admission: ``admission.py``)."""

from __future__ import annotations

import inspect
from types import ModuleType

from workbench.adapters.patching import (
    MARK,
    need_attrs,
    need_params,
    need_source,
    replace_class,
    wrap_method,
)

FIX = ("install sglang==0.5.23 or sglang==0.5.16 (the versions these patches were written and "
       "tested for)")
MEM = "sglang.srt.mem_cache.memory_pool"
ALLOC = "sglang.srt.mem_cache.allocator"
RADIX = "sglang.srt.mem_cache.radix_cache"
CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator"
CHECKER = "sglang.srt.managers.scheduler_components.invariant_checker"
RUNNER = "sglang.srt.model_executor.model_runner"
POLICY = "sglang.srt.managers.schedule_policy"
BATCH = "sglang.srt.managers.schedule_batch"


def check_pool(m: ModuleType) -> str | None:
    cls = getattr(m, "MHATokenToKVPool", None)
    if cls is None:
        return f"{MEM} has no MHATokenToKVPool"
    return (need_attrs(cls, "_create_buffers_normal", "_kv_buffer_shapes", "_create_buffers")
            or need_params(cls.__init__, "size", "page_size", "dtype", "head_num", "head_dim",
                           "layer_num", "device"))


def apply_pool(m: ModuleType):
    from workbench.adapters import hook
    from workbench.adapters.sglang.pool import ElasticMHATokenToKVPool

    undo = replace_class(m, "MHATokenToKVPool", ElasticMHATokenToKVPool, "sglang")
    # the model runner (imported later, by the server only) owns the overlap scheduler's
    # forward stream: fences must wait for it too
    hook.finder().on_load(RUNNER, watch_forward_stream)
    return undo


def watch_forward_stream(_name: str, m: ModuleType) -> None:
    from workbench.adapters import runtime

    cls = getattr(m, "ModelRunner", None)
    if cls is None or getattr(cls.__init__, MARK, False):
        return

    def make(orig):
        def __init__(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            runtime.watch_stream(getattr(self, "forward_stream", None))
        return __init__

    wrap_method(cls, "__init__", make)


def check_mla(m: ModuleType) -> str | None:
    cls = getattr(m, "MLATokenToKVPool", None)
    if cls is None:
        return f"{MEM} has no MLATokenToKVPool"
    return (need_attrs(cls, "_create_buffers")
            or need_params(cls.__init__, "size", "page_size", "dtype", "kv_lora_rank",
                           "qk_rope_head_dim", "layer_num", "device"))


def apply_mla(m: ModuleType):
    from workbench.adapters.sglang.pool import ElasticMLATokenToKVPool

    return replace_class(m, "MLATokenToKVPool", ElasticMLATokenToKVPool, "sglang")


def check_leak(m: ModuleType) -> str | None:
    cls = getattr(m, "SchedulerInvariantChecker", None)
    if cls is None:
        return f"{CHECKER} has no SchedulerInvariantChecker"
    return need_params(cls._check_full_pool, "ps", "uncached")


def apply_leak(m: ModuleType):
    from workbench.adapters.sglang.budget import make_leak_check

    return wrap_method(m.SchedulerInvariantChecker, "_check_full_pool", make_leak_check)


def check_adder(m: ModuleType) -> str | None:
    cls, req = getattr(m, "PrefillAdder", None), getattr(m, "Req", None)
    if cls is None or req is None or not hasattr(getattr(m, "AddReqResult", None), "NO_TOKEN"):
        return f"{POLICY} has no PrefillAdder, Req or AddReqResult.NO_TOKEN"
    return ((need_source(req.__init__, "self.prefix_len")  # 0.5.23; 0.5.16: prefix_indices
             and need_source(req.__init__, "self.prefix_indices"))
            or need_source(req.__init__, "self.full_untruncated_fill_ids")
            or need_attrs(cls, "add_one_req", "add_chunked_req")
            or need_params(cls.add_one_req, "req") or need_params(cls.add_chunked_req, "req")
            or need_source(cls.__init__, "self.token_to_kv_pool_allocator", "self.can_run_list",
                           "self.tree_cache")
            or need_source(cls.add_one_req, "NO_TOKEN")
            or need_source(cls.add_chunked_req, "can_run_list.append"))


def apply_adder(m: ModuleType):
    from workbench.adapters.sglang import admission

    cls, no_token = m.PrefillAdder, m.AddReqResult.NO_TOKEN
    undos = [wrap_method(cls, "__init__", admission.make_adder_init),
             wrap_method(cls, "add_one_req", lambda o: admission.make_add_one_req(o, no_token)),
             wrap_method(cls, "add_chunked_req", admission.make_add_chunked_req)]

    def undo() -> None:
        for one in reversed(undos):
            one()
    return undo


def check_decode(m: ModuleType) -> str | None:
    cls = getattr(m, "ScheduleBatch", None)
    if cls is None:
        return f"{BATCH} has no ScheduleBatch"
    missing = (need_attrs(cls, "check_decode_mem", "new_tokens_required_next_decode")
               or need_params(cls.new_tokens_required_next_decode, "selected_indices"))
    if missing:
        return missing
    first = list(inspect.signature(cls.check_decode_mem).parameters)[1:2]
    return (None if first == ["selected_indices"] else
            f"ScheduleBatch.check_decode_mem's first parameter is {first}, not selected_indices")


def apply_decode(m: ModuleType):
    from workbench.adapters.sglang.admission import make_check_decode_mem

    return wrap_method(m.ScheduleBatch, "check_decode_mem", make_check_decode_mem)


def pool_patches(p) -> list:
    """The KV-pool entries every SGLang version plan takes unchanged (``p`` builds a plan's
    ``Patch`` with its own range and fix)."""
    return [
        p("elastic-mha-pool", MEM, apply_pool, check_pool,
          "MHATokenToKVPool -> ElasticMHATokenToKVPool (K/V views on a workbench pool)"),
        p("elastic-mla-pool", MEM, apply_mla, check_mla,
          "MLATokenToKVPool -> ElasticMLATokenToKVPool (latent views on a workbench pool)"),
    ]


def scheduler_patches(p) -> list:
    """The scheduler-side entries every version plan takes unchanged: the leak check (optional:
    a test box without SGLang's server stack cannot import it) and the admission charges."""
    return [
        p("leak-check-unheld", CHECKER, apply_leak, check_leak,
          "the idle leak check counts unheld slots, not what a limit lets allocate now",
          required=False),
        p("admission-charge", POLICY, apply_adder, check_adder,
          "PrefillAdder charges a request's pages to the shared GPU budget as it admits it",
          server_side=True),
        p("decode-charge", BATCH, apply_decode, check_decode,
          "ScheduleBatch.check_decode_mem charges the step's pages to the shared GPU budget",
          server_side=True),
    ]
