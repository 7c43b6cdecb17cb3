"""SGLang's KV budget and its memory-leak check, made per process for elastic pools.

**Budget.** Stock SGLang sizes its KV pool from the GPU memory *free* after the weights load
(``KVCacheConfigurator._profile_available_bytes``), so a second engine on the same GPU finds
almost nothing free and refuses to start. With elastic KV the pool is a virtual range and pages
are backed on demand, so each process gets a *virtual* budget of its own::

    kv_bytes = B - W - A
    B = WORKBENCH_KV_GPU_UTILIZATION x total device memory   (this process's budget)
    W = torch.cuda.memory_reserved(gpu)                      (its weights, buffers so far)
    A = (1 - mem_fraction_static) x B                         (SGLang's activation slack)

Physical memory is not promised: pages map while the device has room above the same
utilization (the ledger checks the device's free memory before every map), so two engines
share the GPU through the elastic path, each up to what the other leaves.

**Leak check.** SGLang's idle check asserts ``available + evictable + protected + ... == total``.
The elastic allocator's ``available_size`` is what can be allocated *now*, lower under a
``kvctl`` limit or device pressure, which is no leak; the check counts the slots nobody holds
(``unheld_size``) instead.
"""

from __future__ import annotations

import dataclasses

from workbench.errors import ConfigError
from workbench.units import GiB


def virtual_budget(total: int, utilization: float, reserved: int,
                   mem_fraction_static: float) -> int:
    """``B - W - A`` in bytes (see the module doc); ConfigError when nothing is left."""
    budget = int(total * utilization)
    slack = int((1.0 - mem_fraction_static) * budget)
    left = budget - reserved - slack
    if left <= 0:
        raise ConfigError(
            f"KV budget {budget / GiB:.2f} GiB (WORKBENCH_KV_GPU_UTILIZATION={utilization})",
            f"weights and buffers take {reserved / GiB:.2f} GiB and the activation slack "
            f"(1 - mem_fraction_static={mem_fraction_static}) {slack / GiB:.2f} GiB",
            "raise WORKBENCH_KV_GPU_UTILIZATION or --mem-fraction-static, or use a smaller model")
    return left


def make_profile(orig, module, fraction_of=None):
    """``KVCacheConfigurator._profile_available_bytes`` -> the per-process virtual budget.
    ``mem_fraction_static`` comes from ``module.get_schedule()`` (0.5.23) or, when given,
    ``fraction_of(configurator)`` (0.5.16 reads it from its ``server_args``)."""

    def _profile_available_bytes(self, pre_model_load_memory):
        import torch

        from workbench.adapters import runtime
        from workbench.backends import capabilities, for_torch_device

        if not capabilities(for_torch_device(self.device)).cuda:
            return orig(self, pre_model_load_memory)
        index = int(self.gpu_id)
        total = torch.cuda.mem_get_info(index)[1]
        cfg = runtime.pool_config()
        fraction = (fraction_of(self) if fraction_of is not None
                    else module.get_schedule().mem_fraction_static)
        return virtual_budget(total, cfg.gpu_utilization, torch.cuda.memory_reserved(index),
                              fraction)

    return _profile_available_bytes


def make_leak_check(orig):
    """``SchedulerInvariantChecker._check_full_pool`` counting unheld slots as available."""

    def _check_full_pool(self, ps, uncached: int = 0):
        unheld = getattr(self.token_to_kv_pool_allocator, "unheld_size", None)
        if unheld is not None:
            ps = dataclasses.replace(ps, full_available_size=unheld())
        return orig(self, ps, uncached=uncached)

    return _check_full_pool
