"""SGLang's MHA and MLA KV pools with their buffers carved from a workbench pool.

Instead of ``torch.zeros`` per layer, each layer's K and V (MLA: its one latent buffer) is a
zero-copy slot view (``[size + page_size, heads, dim]``) over one reservation on the process's
device for the pool's torch device (:func:`workbench.backends.shared_device`: the host on
CPU, a ``CudaDevice`` on ``cuda:N``). The views are made once, when the pool is built, so their
addresses are fixed before SGLang captures any CUDA graph; pages come and go underneath.

A ledger block is one SGLang page (``page_size`` slots; 1 for the token allocator). Block 0 is
SGLang's padded slot/page 0: the ledger's null block, mapped for the pool's whole life, where
padded tokens write. Layout: CONTIGUOUS (one map per page id) when ``page_size == 1`` and the
config asks for it (the default), since then every slot is one block and slots keep one stride;
PER_LAYER otherwise (a paged slot index needs the slots of a page to be adjacent per layer).
Everything else of the stock pools (set/get KV, descriptors, data pointers) is inherited.
"""

from __future__ import annotations

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

from workbench.adapters import runtime
from workbench.adapters.sglang.views import build_views
from workbench.errors import ConfigError

UNSET = "unset WORKBENCH_KV_AUTOPATCH to run SGLang's own pool"


class ElasticMHATokenToKVPool(MHATokenToKVPool):
    ledger = None
    kv_views = None

    def _create_buffers_normal(self):
        if self.kv_cache_layout != "nhd":
            raise ConfigError(f"SGLang KV layout {self.kv_cache_layout!r}",
                              "the elastic pool builds NHD slot views only",
                              "unset SGLANG_USE_HND_KVCACHE / the AITER layout, or " + UNSET)
        k_shape, v_shape = self._kv_buffer_shapes()
        if k_shape != v_shape:
            raise ConfigError(f"K shape {k_shape} vs V shape {v_shape}",
                              "the elastic pool needs equal K and V head dims",
                              "use a model with v_head_dim == head_dim, or " + UNSET)
        views = build_views(self, heads=self.head_num, dim=self.head_dim, buffers=2,
                            prefix="sglang-mha")
        self.k_buffer, self.v_buffer = views.sglang_buffers()
        runtime.watch_stream(getattr(self, "alt_stream", None))

    def _alloc_post_capture_buffers(self):
        raise ConfigError("SGLang's post-capture KV backing", "the elastic pool already backs "
                          "KV pages on demand under fixed addresses",
                          "turn post-capture KV off, or " + UNSET)


class ElasticMLATokenToKVPool(MLATokenToKVPool):
    """MLA: one latent buffer per layer, ``[size + page_size, 1, kv_lora_rank + rope_dim]``."""

    ledger = None
    kv_views = None

    def _create_buffers(self):
        if getattr(self, "dsa_kv_cache_store_fp8", False) or getattr(self, "use_dsa", False):
            raise ConfigError("SGLang's DSA (sparse-attention) MLA pool",
                              "its indexer buffers are not elastic", UNSET)
        views = build_views(self, heads=1, dim=self.kv_cache_dim, buffers=1, prefix="sglang-mla")
        self.kv_buffer = [views.sglang_buffer(li, 0) for li in range(self.layer_num)]
