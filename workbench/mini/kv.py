"""Where the mini engine's K/V lives: the workbench pool (ledger + virtual range) and torch views.

One :class:`KVStore` = one :class:`~workbench.core.ledger.KVCacheManager` (which hands out block
ids, or ``None`` on a miss) plus, per layer, K and V tensors of shape
``[num_blocks, block_size, kv_heads, head_dim]`` laid over the pool's byte range exactly where
:meth:`KVSpace.view` says each layer's blocks live. Backends differ only in what backs the bytes:

=========  ==========================================================================
``vmm``    the pool's own reservation on a real device (``workbench.gpu`` on CUDA, the host
           VMM device on a CPU): pages are mapped and unmapped under the tensors.
``static`` one plain ``torch.empty`` of the pool's full size on ``device`` (the control:
           what an engine without elastic memory does); the ledger still decides block ids.
=========  ==========================================================================

Both use the same layout and the same view code, so a difference between them is the memory, not
the indexing. Two indexing styles sit on top (seed 001 §3): ``block`` (vLLM: block tables over
``block_size``-token blocks, contiguous layout) and ``token`` (SGLang: a token-slot table over a
per-layer buffer ``[num_slots, kv_heads, head_dim]``; ``page_tokens`` slots per block, 1 by
default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.backends import for_torch_device, make_device
from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError
from workbench.mini.mapper import BackgroundMapper, LockedKVCacheManager
from workbench.mini.model import ModelConfig
from workbench.tensors import KVTensors
from workbench.units import MiB

STYLES = ("block", "token")
BACKENDS = ("vmm", "static")


@dataclass(frozen=True, slots=True)
class KVSpec:
    """How to build a store: indexing style, memory backend, size."""

    style: str = "block"
    backend: str = "static"
    kv_bytes: int = 64 * MiB  # pool capacity (all layers, K and V)
    block_size: int = 16  # tokens per block (``block``) or per SGLang page (``token``)
    page_size: int = 2 * MiB
    min_reserved_pages: int = 0
    max_reserved_pages: int = 4
    gpu_utilization: float = 0.95  # elastic pools: share of the device's memory they may map
    # refill the reserve from a background thread (workbench.mini.mapper), not inside alloc
    background_mapper: bool = False
    ipc_name: str | None = None  # publish the pool's control segment (kvctl, kvtop) under it

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ConfigError(f"style={self.style!r}", "unknown KV indexing style",
                              f"use one of {', '.join(STYLES)}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend={self.backend!r}", "unknown KV memory backend",
                              f"use one of {', '.join(BACKENDS)}")
        if self.background_mapper and self.min_reserved_pages < 1:
            raise ConfigError("background_mapper=True with min_reserved_pages=0",
                              "the mapper keeps a reserve of min_reserved_pages filled",
                              "set min_reserved_pages to 1 or more")


def geometry_for(cfg: ModelConfig, spec: KVSpec) -> KVGeometry:
    bs = spec.block_size
    layout = Layout.CONTIGUOUS if spec.style == "block" else Layout.PER_LAYER
    block_all = bs * cfg.kv_bytes_per_token  # one block across every layer and buffer
    num_blocks = spec.kv_bytes // block_all
    if num_blocks < 2:
        raise ConfigError(f"kv_bytes={spec.kv_bytes}", f"holds {num_blocks} blocks of {bs} tokens",
                          f"give the pool at least {2 * block_all} bytes")
    return KVGeometry(num_layers=cfg.num_layers, kv_heads=cfg.kv_heads,
                      head_dim=cfg.head_dim, block_size=bs, num_blocks=num_blocks,
                      page_size=spec.page_size, layout=layout)


class KVStore:
    """The ledger and the per-layer K/V views of one engine instance."""

    def __init__(self, cfg: ModelConfig, spec: KVSpec, device: str | torch.device = "cpu", *,
                 pool_device=None, name: str = "mini"):
        """``pool_device``: the workbench Device for ``vmm`` (built from ``device`` if None)."""
        self.cfg, self.spec = cfg, spec
        self.device = torch.device(device)
        self.geometry = g = geometry_for(cfg, spec)
        pc = PoolConfig(page_size=spec.page_size, contiguous_layout=g.layout is Layout.CONTIGUOUS,
                        prealloc=spec.min_reserved_pages > 0,
                        min_reserved_pages=spec.min_reserved_pages,
                        max_reserved_pages=max(spec.max_reserved_pages, spec.min_reserved_pages),
                        gpu_utilization=spec.gpu_utilization, ipc_name=spec.ipc_name)
        if spec.backend == "vmm":
            pool_device = pool_device or _vmm_device(self.device)
        else:  # the ledger still runs; a simulated device only keeps its page bookkeeping
            pool_device = make_device("sim", capacity=1 << 50)
        self.mapper: BackgroundMapper | None = None
        if spec.background_mapper:
            self.manager: KVCacheManager = LockedKVCacheManager(g, pool_device, name=name,
                                                                config=pc)
            self.mapper = BackgroundMapper(self.manager, name=f"{name}-mapper")
        else:
            self.manager = KVCacheManager(g, pool_device, name=name, config=pc)
        space = self.manager.space
        raw = (None if spec.backend == "vmm"
               else torch.zeros(space.size, dtype=torch.uint8, device=self.device))
        # one view implementation for CUDA, host and static memory: only the bytes differ
        self._views: KVTensors | None = KVTensors(space, torch.bfloat16, raw=raw)
        on = self._views.raw.device
        if (on.type, on.index or 0) != (self.device.type, self.device.index or 0):
            raise ConfigError(f"KV device {self.device}", f"the pool's memory is on {on}",
                              "pass a pool_device built for that torch device (or leave it None)")
        self._flat: torch.Tensor | None = self._views.raw
        self.k: list[torch.Tensor] = [self._views.block_tensor(i, 0) for i in range(g.num_layers)]
        self.v: list[torch.Tensor] = [self._views.block_tensor(i, 1) for i in range(g.num_layers)]

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.geometry.block_size

    @property
    def entry_tokens(self) -> int:
        """Tokens one table entry covers: a block (``block`` style) or one slot (``token``)."""
        return self.geometry.block_size if self.spec.style == "block" else 1

    def block_rows(self) -> torch.Tensor:
        """``[num_blocks, row_bytes]`` uint8: block ``b`` of every layer and buffer as one row
        (``block`` style, whose contiguous layout keeps a block's layers together)."""
        if self.spec.style != "block":
            raise ConfigError("block_rows", "the per-layer layout splits a block over layers",
                              "build the store with style='block'")
        g = self.geometry
        row = g.block_bytes * g.num_layers * g.num_buffers
        return self._flat[:g.num_blocks * row].view(g.num_blocks, row)

    def token_buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang's ``[num_slots, kv_heads, head_dim]`` views (token style only)."""
        if self.spec.style != "token":
            raise ConfigError("token_buffers", "slot views need the per-layer layout",
                              "build the store with style='token'")
        g = self.geometry
        n = g.num_blocks * g.block_size
        return (self.k[layer].reshape(n, g.kv_heads, g.head_dim),
                self.v[layer].reshape(n, g.kv_heads, g.head_dim))

    def close(self) -> None:
        if self.mapper is not None:  # joined before the pool goes
            self.mapper.stop()
        self.k.clear()
        self.v.clear()
        self._flat = None
        self._views = None
        self.manager.close()


def _vmm_device(device: torch.device):
    # No zero page (on CUDA; the host has none): the kernels never read a block they were not
    # given (masked loads, the null block for padding), so a stray access should fault.
    return make_device(for_torch_device(device), zero_page=False)
