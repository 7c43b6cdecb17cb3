"""vLLM 0.34's extensible KV cache over a workbench KV range: who is in charge of memory.

vLLM 0.34's ``ExtensibleKVCache`` reserves address space for its capacity, lays every layer's
blocks at fixed offsets in it (one segment per layer, padded to the commit granule), commits a
prefix for warm-up, measures free memory once and commits the final prefix at the same base
pointer, so views and captured CUDA graphs stay valid. Its physical memory lives in one object,
the ``ExtensibleTensor`` it builds; the runner hands the cache's ``allocate`` to
``init_kv_cache(..., allocate=...)``.

The plan keeps the cache and its placement and puts :class:`ElasticTensor` where the
``ExtensibleTensor`` was: the reservation is a workbench ``BlockLedger`` (PER_LAYER, page ids =
vLLM's granule-padded segments), bound by the ``allocate`` hook when the runner asks for the
backing. The base pointer is fixed for life, exactly as vLLM's; what changes is who maps pages:
not vLLM's prefix commit but the ``ElasticBlockPool`` as blocks are held, each page charged to
the GPU's shared budget (``WORKBENCH_KV_GPU_BUDGET``). A page no block holds reads the device's
zero page (writable: warm-up writes there harmlessly). vLLM's post-warm-up measurement
(:func:`make_measure`) then keeps the reserved capacity instead of what free memory allowed at
that moment, so a second engine started later is not left with nothing.
"""

from __future__ import annotations

import itertools

import torch

from workbench import backends
from workbench.adapters import runtime
from workbench.adapters.vllm import fanout, registry
from workbench.adapters.vllm.fences import fence_factory
from workbench.adapters.vllm.ledger import BlockLedger
from workbench.adapters.vllm.worker import kv_strides, tensor_geometry
from workbench.errors import ConfigError

UNSET = "unset WORKBENCH_KV_AUTOPATCH to run vLLM's own extensible KV cache"


class ElasticTensor:
    """vLLM's ``ExtensibleTensor`` interface over a workbench ledger (see the module doc).

    Built unbound (vLLM's ``ExtensibleKVCache.__init__`` makes it without the block geometry);
    :meth:`bind` builds the ledger once the cache knows its capacity and segment strides.
    ``resize_segments_`` records vLLM's committed prefix (what it may address) and maps nothing."""

    def __init__(self, max_num_bytes: int, device=None, num_segments: int = 1,
                 segment_capacities=None, export_handle_types: int = 0):
        if export_handle_types:
            raise ConfigError("a KV cache exported to other processes",
                              "elastic pages change under the importer", UNSET)
        caps = list(segment_capacities or [max_num_bytes // num_segments] * num_segments)
        self._max, self._caps = max_num_bytes, caps
        self._offsets = list(itertools.accumulate([0, *caps[:-1]]))
        self._committed = [0] * len(caps)
        self._device = torch.device(device if device is not None else "cuda")
        self.ledger: BlockLedger | None = None
        self._raw: torch.Tensor | None = None

    # -- the allocate hook's binding ------------------------------------------------------
    def bind(self, num_blocks: int, strides: list[int]) -> None:
        if fanout.worker_rank() is not None:
            raise ConfigError("vLLM 0.34 with its model runner in a worker process",
                              "the 0.34 plan backs the cache in the engine-core process only",
                              "use VLLM_ENABLE_V1_MULTIPROCESSING=0 and TP=1, or " + UNSET)
        if len(set(strides)) != 1:
            raise ConfigError(f"KV segments with block strides {sorted(set(strides))}",
                              "one ledger pages one block size", UNSET)
        cfg = runtime.pool_config(contiguous_layout=False)  # vLLM's placement: layer-outermost
        if cfg.page_size % strides[0]:
            raise ConfigError(f"block stride {strides[0]} bytes", f"does not divide the "
                              f"{cfg.page_size}-byte page", "pick a power-of-two block size")
        geo = tensor_geometry(len(strides), strides[0], num_blocks, cfg)
        dev = backends.shared_device(self._device)
        fence = fence_factory(dev)  # CUDA: a page unmaps once the kernels before its free ran
        kv = BlockLedger(geo, dev, name=f"vllm-kv-{len(registry.ledgers)}", config=cfg,
                         defer_release=fence is not None)
        kv.fence = fence
        layer_stride, block_stride = kv_strides(kv.space)
        ours = [i * layer_stride for i in range(len(strides))]
        if ours != self._offsets or kv.space.size != self._max or block_stride != strides[0]:
            kv.close()
            raise ConfigError(f"vLLM's KV segments at {self._offsets[:3]}... of {self._max} "
                              "bytes", f"do not sit on the {cfg.page_size}-byte pages of the "
                              "ledger (vLLM pads each layer to its commit granule)",
                              "set WORKBENCH_KV_PAGE_SIZE to vLLM's granule (2 MiB on CUDA)")
        registry.register(num_blocks, kv)
        self.ledger = kv
        self._raw = kv.space.device.tensor(kv.space.base, kv.space.size, torch.uint8)

    def _bound(self) -> BlockLedger:
        if self.ledger is None:
            raise ConfigError("the elastic KV tensor", "was used before the allocate hook "
                              "bound it to a ledger", UNSET)
        return self.ledger

    # -- vLLM's ExtensibleTensor interface ------------------------------------------------
    def full_view(self) -> torch.Tensor:
        self._bound()
        return self._raw

    def segment_view(self, index: int) -> torch.Tensor:
        start = self._offsets[index]
        return self.full_view()[start:start + self._committed[index]]

    def resize_per_segment_(self, bytes_per_segment: int, zero_new: bool = False) -> None:
        self.resize_segments_([bytes_per_segment] * self.num_segments, zero_new)

    def resize_segments_(self, sizes, zero_new: bool = False) -> None:
        """vLLM's prefix commit, as bookkeeping: the blocks it may address. No page is mapped
        (the pool maps a block's page when it holds the block) and none zeroed: vLLM writes a
        block's KV before attention reads it, as with any reused block."""
        fits = len(sizes) == self.num_segments and all(
            s <= c for s, c in zip(sizes, self._caps, strict=True))
        if not fits:
            raise ValueError(f"segment sizes {list(sizes)} do not fit capacities {self._caps}")
        self._committed = list(sizes)

    def release_physical(self) -> None:
        """Sleep: pages no block holds go now; held ones follow their blocks' frees."""
        self._committed = [0] * self.num_segments
        if self.ledger is not None and not self.ledger.closed:
            self.ledger.reap(wait=True)

    def segments_backed_by_one_chunk(self, sizes) -> list[bool]:
        raise ConfigError("a KV connector that registers the cache for RDMA",
                          "it needs each segment backed by one chunk; elastic pages are mapped "
                          "one at a time", UNSET)

    def free(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
        self._committed = [0] * self.num_segments

    num_bytes = property(lambda self: sum(self._committed))
    bytes_per_segment = property(lambda self: self._uniform(self._committed))
    num_segments = property(lambda self: len(self._caps))
    segment_capacity_bytes = property(lambda self: self._uniform(self._caps))
    segment_capacities = property(lambda self: list(self._caps))
    segment_offsets = property(lambda self: list(self._offsets))
    capacity_bytes = property(lambda self: self._max)
    physical_bytes = property(lambda self: self.ledger.mapped_bytes if self.ledger else 0)
    num_physical_chunks = property(
        lambda self: self.ledger.pages.mapped_pages if self.ledger else 0)
    granularity = property(lambda self: runtime.pool_config().page_size)
    base_ptr = property(lambda self: self._bound().space.base)
    device = property(lambda self: self._device)

    @staticmethod
    def _uniform(values: list[int]) -> int:
        if any(v != values[0] for v in values):
            raise ValueError(f"Segments differ: {values}.")
        return values[0]


def make_allocate(orig):
    """``ExtensibleKVCache.allocate``, the ``allocate=`` hook the runner passes to
    ``init_kv_cache``: bind the elastic tensor to a ledger of the cache's capacity, then vLLM's
    own allocate (commit the null block, return the full view at the fixed base)."""

    def allocate(self, size: int):
        if isinstance(self.buffer, ElasticTensor) and self.buffer.ledger is None:
            self.buffer.bind(self.capacity_blocks, list(self.segment_strides))
        return orig(self, size)

    return allocate


def make_measure(orig):
    """``measure_kv_cache_blocks`` after warm-up: an elastic cache keeps its reserved capacity
    (pages follow held blocks, the shared budget bounds them); a stock one is measured."""

    def measure_kv_cache_blocks(kv_cache, *args, **kwargs):
        if isinstance(getattr(kv_cache, "buffer", None), ElasticTensor):
            return kv_cache.capacity_blocks
        return orig(kv_cache, *args, **kwargs)

    return measure_kv_cache_blocks
