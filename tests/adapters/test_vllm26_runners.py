"""vLLM 0.26's two model runners through one plan, engine-free on the host device: Model Runner
V2's KV allocation (``attn_utils.init_kv_cache`` calling ``_allocate_kv_cache`` and
``_reshape_kv_cache``) gives the same views over a ledger's range as V1's methods, shared layers
aliased; each seam's check refuses a moved seam in one line; and the worker check refuses the
runner vLLM chose when its KV did not come through that runner's seam. The fakes keep the real
0.26 signatures and call structure (read from the 0.26.0 wheel); vLLM itself: tests/gpu."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

from workbench.adapters.vllm import plan26, registry, worker26
from workbench.errors import ConfigError

torch = pytest.importorskip("torch")
NB, BS, H, D = 256, 16, 2, 64  # 16-token blocks of 2 heads x 64 in bf16: 8 KiB (K+V) a layer


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int = BS
    num_kv_heads: int = H
    head_size: int = D
    dtype: torch.dtype = torch.bfloat16
    kv_quant_mode: None = None

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * 2


class FlashBackend:  # K/V first, as FlashAttention's
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str):
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order():
        return (0, 1, 2, 3, 4)


@dataclass
class AttnGroup:
    backend: type
    layer_names: list[str]
    kv_cache_spec: FullAttentionSpec
    kv_cache_group_id: int = 0


@dataclass
class KVGroup:
    layer_names: list[str]
    kv_cache_spec: FullAttentionSpec


@dataclass
class KVConfig:
    num_blocks: int
    kv_cache_groups: list[KVGroup]


LAYERS = ["layers.0.attn", "layers.1.attn", "layers.2.attn"]
SHARED = {"layers.3.attn": "layers.1.attn"}  # a layer reading another's KV


def _attn_utils() -> types.ModuleType:
    """MRV2's ``attn_utils`` as 0.26 has it: ``init_kv_cache`` finds both steps in the module's
    globals; the stock steps allocate and reshape ``torch.zeros`` (the seam replaces them)."""
    m = types.ModuleType("fake_attn_utils")

    def _allocate_kv_cache(kv_cache_config, shared_layers, device):
        return {n: torch.zeros(kv_cache_config.num_blocks * FullAttentionSpec().page_size_bytes,
                               dtype=torch.int8, device=device)
                for g in kv_cache_config.kv_cache_groups for n in g.layer_names
                if n not in shared_layers}

    def _reshape_kv_cache(attn_groups, kv_cache_raw_tensors, cache_dtype, kernel_block_sizes,
                          shared_kv_cache_layers, kv_cache_config=None):
        raise AssertionError("stock reshape ran: the seam did not take")

    def init_kv_cache(runner_kv_caches, forward_context, kv_cache_config, attn_groups, device,
                      cache_dtype, kernel_block_sizes, vllm_config):
        raw = m._allocate_kv_cache(kv_cache_config, SHARED, device)
        flat = [g for groups in attn_groups for g in groups]
        return m._reshape_kv_cache(attn_groups=flat, kv_cache_raw_tensors=raw,
                                   kernel_block_sizes=kernel_block_sizes,
                                   cache_dtype=cache_dtype, shared_kv_cache_layers=SHARED,
                                   kv_cache_config=kv_cache_config)

    m._allocate_kv_cache, m._reshape_kv_cache, m.init_kv_cache = (
        _allocate_kv_cache, _reshape_kv_cache, init_kv_cache)
    return m


@pytest.fixture
def host_env(monkeypatch, tmp_path):
    for k in ("GPU_BUDGET", "MIN_RESERVED_PAGES", "MAX_RESERVED_PAGES"):
        monkeypatch.setenv(f"WORKBENCH_KV_{k}", "0")
    monkeypatch.setenv("WORKBENCH_KV_SHM_DIR", str(tmp_path))
    monkeypatch.setattr(registry, "ledgers", [])
    kvi = types.ModuleType("vllm.v1.kv_cache_interface")
    kvi.FullAttentionSpec = FullAttentionSpec
    for name, mod in (("vllm", types.ModuleType("vllm")), ("vllm.v1", types.ModuleType("vllm.v1")),
                      ("vllm.v1.kv_cache_interface", kvi)):
        monkeypatch.setitem(sys.modules, name, mod)
    yield
    for _, kv in registry.ledgers:
        kv.close()


def _config():
    spec = FullAttentionSpec()
    names = LAYERS + list(SHARED)
    return (KVConfig(NB, [KVGroup(names, spec)]),
            [[AttnGroup(FlashBackend, names, spec)]])


def test_mrv2_kv_views_are_v1s_views_over_the_ledgers_range(host_env):
    mod = _attn_utils()
    assert plan26._check_runner_v2(mod) is None
    undo = plan26._apply_runner_v2(mod)
    cfg, groups = _config()
    views = mod.init_kv_cache([], {}, cfg, groups, "cpu", "auto", [BS], None)
    undo()
    (_, kv2), = registry.ledgers
    assert kv2.runner == "v2" and registry.ledger_for(NB) is kv2
    assert set(views) == set(LAYERS) | set(SHARED)
    assert views["layers.3.attn"] is views["layers.1.attn"]  # aliased, as vLLM's reshape does
    base, end = kv2.space.base, kv2.space.base + kv2.space.size
    assert all(base <= v.data_ptr() < end for v in views.values())
    # V1's builder over the same groups gives the same shapes and strides (one view builder)
    kv1, v1 = worker26.build_views(groups[0], cfg, "cpu", [BS], set(SHARED), "v1")
    assert kv1.runner == "v1"
    for n in LAYERS:
        assert (views[n].shape, views[n].stride()) == (v1[n].shape, v1[n].stride())
        assert views[n].data_ptr() - base == v1[n].data_ptr() - kv1.space.base
    assert mod._reshape_kv_cache.__name__ == "_reshape_kv_cache"  # undone: the stock one again
    with pytest.raises(AssertionError, match="stock reshape ran"):
        mod.init_kv_cache([], {}, cfg, groups, "cpu", "auto", [BS], None)


def test_a_view_writes_where_the_ledger_places_that_layers_block(host_env):
    mod = _attn_utils()
    undo = plan26._apply_runner_v2(mod)
    cfg, groups = _config()
    views = mod.init_kv_cache([], {}, cfg, groups, "cpu", "auto", [BS], None)
    undo()
    (_, kv), = registry.ledgers
    kv.hold([7])
    flat = kv.space.device.tensor(kv.space.base, kv.space.size, torch.bfloat16)
    for li, n in enumerate(LAYERS):
        views[n][1, 7].fill_(li + 1.0)  # V of block 7
        at = (kv.space.block_address(li, 1, 7) - kv.space.base) // 2
        assert bool((flat[at:at + BS * H * D] == li + 1.0).all())


@pytest.mark.parametrize(("drop", "why"), [
    ("_reshape_kv_cache", "lacks _reshape_kv_cache"),
    ("_allocate_kv_cache", "lacks _allocate_kv_cache"),
])
def test_a_moved_mrv2_seam_is_refused_by_its_check(host_env, drop, why):
    mod = _attn_utils()
    delattr(mod, drop)
    assert why in plan26._check_runner_v2(mod)


def test_an_init_kv_cache_that_no_longer_calls_the_steps_is_refused(host_env):
    mod = _attn_utils()

    def init_kv_cache(runner_kv_caches, forward_context, kv_cache_config, attn_groups, device,
                      cache_dtype, kernel_block_sizes, vllm_config):
        return {}

    mod.init_kv_cache = init_kv_cache
    assert "no longer uses _allocate_kv_cache(" in plan26._check_runner_v2(mod)


def _worker_module(runner_seam: str | None):
    """A ``gpu_worker`` whose Worker keeps vLLM's runner choice and whose runner's KV init
    registers a ledger built by ``runner_seam`` (None: no seam fired, plain zeros)."""
    m = types.ModuleType("fake_gpu_worker")

    class Worker:
        def __init__(self, vllm_config):
            self.use_v2_model_runner = vllm_config.use_v2_model_runner

        def init_device(self):
            if self.use_v2_model_runner:
                return "GPUModelRunnerV2"
            return "GPUModelRunnerV1"

        def initialize_from_config(self, kv_cache_config):
            if runner_seam is not None:
                cfg, groups = _config()
                worker26.build_views(groups[0], cfg, "cpu", [BS], set(SHARED), runner_seam)

    m.Worker = Worker
    return m


@pytest.mark.parametrize(("v2", "seam", "ok"), [
    (True, "v2", True), (False, "v1", True), (True, "v1", False), (True, None, False),
    (False, "v2", False)])
def test_the_runner_vllm_chose_must_have_built_its_kv_through_its_seam(host_env, v2, seam, ok):
    m = _worker_module(seam)
    assert plan26._check_runner_guard(m) is None
    undo = plan26._apply_runner_guard(m)
    try:
        w = m.Worker(types.SimpleNamespace(use_v2_model_runner=v2))
        if ok:
            w.initialize_from_config(None)
            assert w.workbench_runner == ("v2" if v2 else "v1")
            return
        with pytest.raises(ConfigError) as err:
            w.initialize_from_config(None)
        msg = str(err.value)
        assert "\n" not in msg
        name, patch = ("Model Runner V2", "elastic-kv-tensors-v2") if v2 else (
            "model runner V1", "elastic-kv-tensors")
        assert name in msg and repr(patch) in msg and plan26.RUNNERS[plan26.runner_of(w)][1] \
            == patch
    finally:
        undo()


def test_a_worker_that_no_longer_keeps_the_runner_choice_is_refused():
    m = types.ModuleType("fake_gpu_worker")

    class Worker:
        def __init__(self, vllm_config):
            pass

        def init_device(self):
            pass

        def initialize_from_config(self, kv_cache_config):
            pass

    m.Worker = Worker
    assert "no longer uses self.use_v2_model_runner" in plan26._check_runner_guard(m)


def test_the_plan_names_a_kv_patch_for_each_runner_and_the_check():
    patches = {p.name: p.module for p in plan26.build_plan().patches}
    for module, patch in plan26.RUNNERS.values():
        assert patches[patch] == module
    assert patches["kv-runner-check"] == plan26.WORKER
