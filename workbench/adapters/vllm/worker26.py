"""vLLM 0.26's model-runner seams: KV tensors as zero-copy views over a workbench ledger's range,
for both of its runners.

0.26 has no ``vllm.v1.worker.utils.allocate_kv_cache``. Each runner allocates, then reshapes:

* **V1** (``GPUModelRunner`` in ``gpu_model_runner``): ``initialize_kv_cache_tensors`` calls the
  methods ``_allocate_kv_cache_tensors`` (one ``torch.zeros`` per tensor) and
  ``_reshape_kv_cache_tensors`` (the attention backend's shape and stride order over it).
* **Model Runner V2** (``VLLM_USE_V2_MODEL_RUNNER=1``, ``vllm.v1.worker.gpu``): the runner's
  ``initialize_kv_cache`` calls ``attn_utils.init_kv_cache``, which calls that module's functions
  ``_allocate_kv_cache`` and ``_reshape_kv_cache`` (the same two steps over the flattened
  attention groups; layers that share another's KV are aliased after).

We replace both steps of each: the first returns empty placeholders (nothing is allocated), the
second builds the ledger, whose range is reserved once, before any CUDA graph is captured, so every
address the graphs record stays valid while pages come and go; each layer's tensor is an
``as_strided`` view with the backend's logical shape. The block ids both runners' block tables
hold are the scheduler's (V2 expands them to kernel blocks the same way), so one view builder
serves both. The ledger records which runner's seam built it (``runner``).

Layouts. A layer's block is ``spec.page_size_bytes`` (K and V). Blocks-first backends (Triton:
``[blocks, heads, block_size, 2*head]``) treat it as one opaque buffer; K/V-first ones
(FlashAttention: ``[2, blocks, ...]``) as two (K, V). The default ``CONTIGUOUS`` layout interleaves
every layer's block, so one page id is one map (``WORKBENCH_KV_CONTIGUOUS_LAYOUT=0`` gives
``PER_LAYER``); a kernel block smaller than vLLM's block needs uniform kernel-block strides, which
only ``PER_LAYER`` has, so that case takes ``PER_LAYER`` by itself.
"""

from __future__ import annotations

import logging
import math

import torch

from workbench.adapters import runtime
from workbench.adapters.vllm import registry
from workbench.adapters.vllm.fences import fence_factory
from workbench.adapters.vllm.ledger import BlockLedger
from workbench.backends import shared_device
from workbench.core.geometry import KVGeometry, Layout
from workbench.errors import ConfigError

FIX = "unset WORKBENCH_KV_AUTOPATCH for this model"
RUNNER_NAMES = {"v1": "model runner V1", "v2": "Model Runner V2"}
log = logging.getLogger("workbench.autopatch")


def allocate_placeholders(orig):
    def _allocate_kv_cache_tensors(self, kv_cache_config):
        names = [n for g in kv_cache_config.kv_cache_groups for n in g.layer_names
                 if n not in self.runner_only_attn_layers]
        empty = torch.empty(0, dtype=torch.int8, device=self.device)
        return dict.fromkeys(names, empty)

    return _allocate_kv_cache_tensors


def _only_group(attn_groups, kernel_block_sizes):
    groups = [g for g in attn_groups if g.kv_cache_group_id < len(kernel_block_sizes)]
    ids = {g.kv_cache_group_id for g in groups}
    if len(ids) != 1:
        raise ConfigError(f"{len(ids)} KV cache groups", "the elastic runner handles one "
                          "uniform full-attention group", FIX)
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = groups[0].kv_cache_spec
    quant = getattr(spec, "kv_quant_mode", None)
    if type(spec) is not FullAttentionSpec or (quant is not None and quant.name != "NONE"):
        raise ConfigError(f"KV spec {type(spec).__name__}", "not a plain unquantized "
                          "full-attention spec", FIX)
    return groups, spec, kernel_block_sizes[groups[0].kv_cache_group_id]


def _kv_shape(backend, num_blocks: int, spec, kernel_bs: int):
    shape = tuple(backend.get_kv_cache_shape(num_blocks, kernel_bs, spec.num_kv_heads,
                                             spec.head_size, cache_dtype_str="auto"))
    try:
        order = tuple(backend.get_kv_cache_stride_order())
        if len(order) != len(shape):
            order = tuple(range(len(shape)))
    except (AttributeError, NotImplementedError):
        order = tuple(range(len(shape)))
    phys = [shape[i] for i in order]
    if phys[0] == num_blocks:
        return shape, order, 1
    if phys[0] == 2 and phys[1] == num_blocks:
        return shape, order, 2
    raise ConfigError(f"KV cache shape {shape} (stride order {order})",
                      "neither blocks-first nor K/V-first", FIX)


def build_views(attn_groups, kv_cache_config, device, kernel_block_sizes, skip, runner: str):
    """Every attention layer's KV view (but those in ``skip``) over one new ledger's range;
    ``runner`` (``v1``, ``v2``) names the seam that built it."""
    groups, spec, kbs = _only_group(attn_groups, kernel_block_sizes)
    num_blocks, per = kv_cache_config.num_blocks, spec.block_size // kbs
    names = [n for g in groups for n in g.layer_names if n not in skip]
    shape, order, buffers = _kv_shape(groups[0].backend, num_blocks * per, spec, kbs)
    dtype = spec.dtype
    e = torch.empty((), dtype=dtype).element_size()
    block = spec.page_size_bytes
    if math.prod(shape) * e != num_blocks * block:
        raise ConfigError(f"KV block of {block} bytes", "padded pages are not handled", FIX)
    cfg = runtime.pool_config()
    if per > 1:  # kernel blocks need one stride: only PER_LAYER gives it
        cfg = runtime.pool_config(contiguous_layout=False)
    if cfg.page_size % block:
        raise ConfigError(f"KV block of {block} bytes", f"does not divide the {cfg.page_size}"
                          "-byte page, so a block would straddle two pages",
                          "use a power-of-two block size or another WORKBENCH_KV_PAGE_SIZE")
    layout = Layout.CONTIGUOUS if cfg.contiguous_layout else Layout.PER_LAYER
    geo = KVGeometry(num_layers=len(names), kv_heads=1, head_dim=block // buffers // e,
                     block_size=1, num_blocks=num_blocks, num_buffers=buffers, dtype_bytes=e,
                     page_size=cfg.page_size, layout=layout)
    dev = shared_device(device)
    kv = BlockLedger(geo, dev, name=f"vllm-kv-{len(registry.ledgers)}", config=cfg,
                     defer_release=fence_factory(dev) is not None)
    kv.fence = fence_factory(dev)
    kv.runner = runner
    registry.register(num_blocks, kv)
    flat = dev.tensor(kv.space.base, kv.space.size, dtype)
    views = {n: _layer_view(kv, flat, li, shape, order, buffers, per)
             for li, n in enumerate(names)}
    log.info("workbench autopatch: %d KV views for vLLM's %s (%s, %d blocks)",
             len(views), RUNNER_NAMES[runner], layout.name, num_blocks)
    return kv, views


def _layer_view(kv, flat, layer, shape, order, buffers, per):
    """The backend's logical tensor: its physical order made with our block (and K/V) strides,
    then permuted back, exactly as vLLM's own reshape does over a contiguous buffer."""
    e = kv.geometry.dtype_bytes
    space = kv.space
    v0 = space.view(layer, 0)
    phys = [shape[i] for i in order]
    lead = 1 if buffers == 1 else 2  # dims before the contiguous inside of a block
    strides, run = [0] * len(phys), 1
    for i in range(len(phys) - 1, lead - 1, -1):
        strides[i] = run
        run *= phys[i]
    kernel_block = run  # elements of one kernel block of one buffer
    if per > 1:
        block_stride = kernel_block  # PER_LAYER: kernel blocks back to back
    else:
        block_stride = v0.block_stride // e
    if buffers == 1:
        strides[0] = block_stride
    else:
        strides[0] = (space.view(layer, 1).offset - v0.offset) // e
        strides[1] = block_stride
    t = flat.as_strided(phys, strides, flat.storage_offset() + v0.offset // e)
    inv = [order.index(i) for i in range(len(order))]
    return t.permute(*inv)


# -- V1: GPUModelRunner's methods ------------------------------------------------------------
def reshape_views(orig):
    def _reshape_kv_cache_tensors(self, kv_cache_raw_tensors, kernel_block_sizes):
        kv, views = build_views(self._kv_cache_spec_attn_group_iterator(), self.kv_cache_config,
                                self.device, kernel_block_sizes, self.runner_only_attn_layers,
                                "v1")
        self.workbench_ledger = kv
        return views

    return _reshape_kv_cache_tensors


# -- Model Runner V2: attn_utils' functions --------------------------------------------------
def allocate_placeholders_v2(orig):
    def _allocate_kv_cache(kv_cache_config, shared_layers, device):
        empty = torch.empty(0, dtype=torch.int8, device=device)
        return {n: empty for g in kv_cache_config.kv_cache_groups for n in g.layer_names
                if n not in shared_layers}

    return _allocate_kv_cache


def reshape_views_v2(orig):
    def _reshape_kv_cache(attn_groups, kv_cache_raw_tensors, cache_dtype, kernel_block_sizes,
                          shared_kv_cache_layers, kv_cache_config=None):
        if kv_cache_config is None:
            raise ConfigError("Model Runner V2's KV reshape without its kv_cache_config",
                              "the view builder needs the block count", FIX)
        device = next(iter(kv_cache_raw_tensors.values())).device
        _, views = build_views(attn_groups, kv_cache_config, device, kernel_block_sizes,
                               shared_kv_cache_layers, "v2")
        for name, target in shared_kv_cache_layers.items():  # as vLLM's own reshape does
            views[name] = views[target]
        return views

    return _reshape_kv_cache

