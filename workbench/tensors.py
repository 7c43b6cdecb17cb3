"""KV tensors as torch views over a pool's reserved range: one implementation for every device.

A device that holds real memory gives one flat byte tensor over a range (``device.tensor(va,
nbytes, dtype)``: the host device through ``torch.frombuffer``, the CUDA device through the raw
pointer, see :mod:`workbench.gpu.tensors`). Every engine tensor is an ``as_strided`` view of it,
with the byte offsets and block strides that :meth:`KVSpace.view` gives for the layout. So block
``b`` of a view *is* the bytes at ``KVSpace.block_address(layer, buffer, b)``, mapped or not:
unmapped blocks read the zero page, and (where the zero page is read-only) fault on write.

Shapes:

* vLLM (FlashAttention NHD), per layer: ``[2, num_blocks, block_size, kv_heads, head_dim]``;
* SGLang, per layer: ``k_buffer[l]`` / ``v_buffer[l]`` of ``[slots, kv_heads, head_dim]``. A flat
  slot index needs a uniform slot stride, which the CONTIGUOUS layout only has when
  ``block_size == 1`` (SGLang's default page size): otherwise use PER_LAYER;
* MLA latent (``num_buffers == 1``), per layer: ``[num_blocks, block_size, 1, head_dim]``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from workbench.core.geometry import KVGeometry
from workbench.core.vspace import KVSpace
from workbench.errors import ConfigError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "fp8": torch.float8_e4m3fn, "int8": torch.int8, "uint8": torch.uint8}
_DEFAULT = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32}


def resolve_dtype(geo: KVGeometry, dtype: torch.dtype | str | None) -> torch.dtype:
    """``dtype`` (a torch dtype or a name from :data:`DTYPES`), checked against the pool."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ConfigError(f"dtype {dtype!r}", "is not a KV dtype name",
                              f"use one of {', '.join(DTYPES)} or a torch dtype")
        dtype = DTYPES[dtype]
    if dtype is None:
        if geo.dtype_bytes not in _DEFAULT:
            raise ConfigError("dtype=None", f"no default for {geo.dtype_bytes}-byte elements",
                              "pass the engine's torch dtype")
        return _DEFAULT[geo.dtype_bytes]
    if torch.empty((), dtype=dtype).element_size() != geo.dtype_bytes:
        raise ConfigError(f"dtype {dtype}", f"the pool was sized for {geo.dtype_bytes}-byte "
                          "elements", "pass a dtype of that size or rebuild the geometry")
    return dtype


def raw_tensor(space: KVSpace) -> torch.Tensor:
    """One uint8 tensor over the whole reservation, from the device that holds it."""
    dev = space.device
    view = getattr(dev, "tensor", None)  # FaultyDevice passes it through
    if view is None:
        raise ConfigError(f"tensor views on device {dev.name!r}", "it holds no real memory "
                          "(the simulated GPU keeps only page bookkeeping)",
                          "use the host device (CPU) or the gpu backend (CUDA), or pass raw=")
    return view(space.base, space.size, torch.uint8)


class KVTensors:
    """Typed views over one :class:`KVSpace` (keep it alive as long as the views are used).

    ``raw``: a uint8 tensor of ``space.size`` bytes to lay the views over instead of the device's
    memory (a static control pool, or a stand-in in tests); the layout arithmetic is the same.
    """

    def __init__(self, space: KVSpace, dtype: torch.dtype | str | None = None, *,
                 raw: torch.Tensor | None = None):
        self.space = space
        self.geometry = g = space.geometry
        self.dtype = resolve_dtype(g, dtype)
        self.raw = raw_tensor(space) if raw is None else raw
        if self.raw.dtype != torch.uint8 or self.raw.numel() != space.size:
            raise ConfigError(f"raw tensor of {self.raw.numel()} {self.raw.dtype} elements",
                              f"views need {space.size} uint8 bytes (the pool's range)",
                              "pass torch.empty(space.size, dtype=torch.uint8)")
        self.flat = self.raw.view(self.dtype)
        self._e = g.dtype_bytes

    def _elems(self, nbytes: int) -> int:
        return nbytes // self._e

    def _strided(self, shape: list[int], strides: list[int], offset: int) -> torch.Tensor:
        # as_strided counts the offset from the storage's start, not from flat's first element
        return self.flat.as_strided(shape, strides, self.flat.storage_offset() + offset)

    # -- views -------------------------------------------------------------------------------
    def block_tensor(self, layer: int, buffer: int,
                     shape_per_block: tuple[int, ...] | None = None) -> torch.Tensor:
        """``[num_blocks, block_size, kv_heads, head_dim]`` (or ``[num_blocks,
        *shape_per_block]``, contiguous inside a block) of one layer's K (0) or V (1)."""
        g = self.geometry
        shape = tuple(shape_per_block or (g.block_size, g.kv_heads, g.head_dim))
        if math.prod(shape) * self._e != g.block_bytes:
            raise ConfigError(f"block shape {shape}", f"is {math.prod(shape) * self._e} bytes, "
                              f"the pool's block is {g.block_bytes}",
                              "pass a shape whose elements fill exactly one block")
        v = self.space.view(layer, buffer)
        inner = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        return self._strided([g.num_blocks, *shape], [self._elems(v.block_stride), *inner],
                             self._elems(v.offset))

    def vllm_layer(self, layer: int) -> torch.Tensor:
        """vLLM's FlashAttention cache of one layer: ``[2, num_blocks, block_size, heads, dim]``."""
        if self.geometry.num_buffers != 2:
            raise ConfigError("a vLLM [2, ...] cache", "the pool has one (MLA) buffer",
                              "use mla_layer() for MLA pools")
        k = self.block_tensor(layer, 0)
        off = self._elems(self.space.view(layer, 0).offset)
        kv_stride = self._elems(self.space.view(layer, 1).offset) - off
        return self._strided([2, *k.shape], [kv_stride, *k.stride()], off)

    def vllm_caches(self) -> list[torch.Tensor]:
        return [self.vllm_layer(i) for i in range(self.geometry.num_layers)]

    def mla_layer(self, layer: int) -> torch.Tensor:
        """An MLA latent cache: ``[num_blocks, block_size, 1, head_dim]`` (``kv_heads == 1``)."""
        g = self.geometry
        if g.num_buffers != 1 or g.kv_heads != 1:
            raise ConfigError("an MLA latent cache", f"the pool has {g.num_buffers} buffers and "
                              f"{g.kv_heads} heads", "build it with KVGeometry.for_model(mla=True)")
        return self.block_tensor(layer, 0)

    def mla_caches(self) -> list[torch.Tensor]:
        return [self.mla_layer(i) for i in range(self.geometry.num_layers)]

    def sglang_buffer(self, layer: int, buffer: int) -> torch.Tensor:
        """SGLang's ``[slots, kv_heads, head_dim]``; slot ``s`` is in block ``s // block_size``."""
        g = self.geometry
        v = self.space.view(layer, buffer)
        if g.block_size > 1 and v.block_stride != g.block_bytes:
            raise ConfigError(
                f"a flat SGLang slot view with block_size={g.block_size}",
                "the CONTIGUOUS layout interleaves layers between blocks, so slots have no "
                "single stride", "use Layout.PER_LAYER (contiguous_layout=False), or "
                "block_size=1 (SGLang page size 1)")
        shape = [g.num_slots, g.kv_heads, g.head_dim]
        slot_stride = self._elems(v.block_stride) if g.block_size == 1 else g.kv_heads * g.head_dim
        return self._strided(shape, [slot_stride, g.head_dim, 1], self._elems(v.offset))

    def sglang_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(k_buffer, v_buffer)``: one ``[slots, heads, dim]`` tensor per layer each."""
        g = self.geometry
        if g.num_buffers != 2:
            raise ConfigError("SGLang k_buffer/v_buffer", "the pool has one (MLA) buffer",
                              "use mla_caches() for MLA pools")
        n = g.num_layers
        return ([self.sglang_buffer(i, 0) for i in range(n)],
                [self.sglang_buffer(i, 1) for i in range(n)])

    # -- addresses ---------------------------------------------------------------------------
    def block_bytes(self, layer: int, buffer: int, block: int) -> torch.Tensor:
        """The raw bytes of one block (a uint8 view), for checks."""
        a = self.space.block_address(layer, buffer, block) - self.space.base
        return self.raw[a:a + self.geometry.block_bytes]

    def page_ranges(self, page: int) -> list[tuple[int, int]]:
        """Byte ranges (relative to the base) that back ``page``."""
        return [(t.va - self.space.base, t.size) for t in self.space.targets(page)]


def kv_tensors(pool: Any, dtype: torch.dtype | str | None = None) -> KVTensors:
    """Views over a :class:`KVCacheManager`'s (or a bare :class:`KVSpace`'s) range."""
    space = pool.space if hasattr(pool, "space") else pool
    return KVTensors(space, dtype)


__all__ = ["DTYPES", "KVTensors", "kv_tensors", "raw_tensor", "resolve_dtype"]
