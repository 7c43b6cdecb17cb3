"""The KV tensor views SGLang's pools get: one ledger and zero-copy slot views per layer over one
reservation. Engine-free (SGLang is not imported), so a chapter cell builds the very views the
elastic MHA/MLA pools (``pool.py``) hand SGLang, on any machine."""

from __future__ import annotations

import dataclasses

from workbench import backends
from workbench.adapters import runtime
from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.errors import ConfigError
from workbench.tensors import KVTensors


def build_views(pool, *, heads: int, dim: int, buffers: int, prefix: str,
                config: PoolConfig | None = None) -> KVTensors:
    """Ledger + views for ``pool`` (an SGLang KV pool whose size/page_size/layer_num/
    store_dtype/device are set); sets ``pool.ledger`` and ``pool.kv_views``."""
    rows, ps = pool.size + pool.page_size, pool.page_size
    if rows % ps:
        raise ConfigError(f"{rows} slots with page_size {ps}", "not whole pages",
                          "make the pool size a multiple of page_size")
    cfg = config or runtime.pool_config()  # config: a caller's own knobs (else WORKBENCH_KV_*)
    if ps > 1 and cfg.contiguous_layout:
        cfg = dataclasses.replace(cfg, contiguous_layout=False)  # paged slots: per-layer blocks
    layout = Layout.CONTIGUOUS if cfg.contiguous_layout else Layout.PER_LAYER
    geo = KVGeometry(num_layers=pool.layer_num, kv_heads=heads, head_dim=dim, block_size=ps,
                     num_blocks=rows // ps, num_buffers=buffers,
                     dtype_bytes=pool.store_dtype.itemsize, page_size=cfg.page_size,
                     layout=layout)
    device = backends.shared_device(pool.device)
    pool.ledger = runtime.make_ledger(geo, device, prefix, cfg)
    pool.kv_views = KVTensors(pool.ledger.space, pool.store_dtype)
    return pool.kv_views
