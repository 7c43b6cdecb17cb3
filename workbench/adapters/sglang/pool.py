"""``ElasticMHATokenToKVPool``: SGLang's MHA pool with its K/V buffers carved from a workbench
pool instead of ``torch.zeros``.

Each layer's K and V are slot views (``[size + page_size, heads, dim]``) into one per-layer-layout
reservation; a block of the ledger is one SGLang page (``page_size`` slots; 1 for the token
allocator) and block 0 is SGLang's padded slot/page 0, which the ledger keeps mapped as its null
block. Everything else of the stock pool (set/get KV, layouts of the descriptors) is inherited.
"""

from __future__ import annotations

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from workbench.adapters import runtime
from workbench.core.geometry import KVGeometry, Layout
from workbench.errors import ConfigError


class ElasticMHATokenToKVPool(MHATokenToKVPool):
    ledger = None

    def _create_buffers_normal(self):
        if self.kv_cache_layout != "nhd":
            raise ConfigError(f"SGLang KV layout {self.kv_cache_layout!r}",
                              "the elastic pool builds NHD slot views only",
                              "unset SGLANG_USE_HND_KVCACHE / the AITER layout, or unset "
                              "WORKBENCH_KV_AUTOPATCH")
        k_shape, v_shape = self._kv_buffer_shapes()
        if k_shape != v_shape:
            raise ConfigError(f"K shape {k_shape} vs V shape {v_shape}",
                              "the elastic pool needs equal K and V head dims",
                              "use a model with v_head_dim == head_dim or unset "
                              "WORKBENCH_KV_AUTOPATCH")
        rows, ps = k_shape[0], self.page_size
        if rows % ps:
            raise ConfigError(f"{rows} slots with page_size {ps}", "not whole pages",
                              "make the pool size a multiple of page_size")
        cfg = runtime.pool_config(contiguous_layout=False)  # slot views need per-layer blocks
        geo = KVGeometry(num_layers=self.layer_num, kv_heads=self.head_num,
                         head_dim=self.head_dim, block_size=ps, num_blocks=rows // ps,
                         dtype_bytes=self.store_dtype.itemsize, page_size=cfg.page_size,
                         layout=Layout.PER_LAYER)
        self.ledger = runtime.make_ledger(geo, runtime.device_for(self.device), "sglang-mha",
                                          cfg)
        from workbench.host.views import slot_view

        space = self.ledger.space
        self.k_buffer = [slot_view(space, li, 0, self.store_dtype) for li in range(geo.num_layers)]
        self.v_buffer = [slot_view(space, li, 1, self.store_dtype) for li in range(geo.num_layers)]
