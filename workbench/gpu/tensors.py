"""KV tensors as torch views over a pool's reserved range: no copies, in the engines' shapes.

One uint8 tensor spans the whole reservation (built from the raw device pointer through
``__cuda_array_interface__``); every engine tensor is an ``as_strided`` view of it, with the byte
offsets and block strides that :meth:`KVSpace.view` gives for the layout. So block ``b`` of a
view *is* the bytes at ``KVSpace.block_address(layer, buffer, b)``, mapped or not: unmapped blocks
read the zero page.

Shapes:

* vLLM (FlashAttention NHD), per layer: ``[2, num_blocks, block_size, kv_heads, head_dim]``;
* SGLang, per layer: ``k_buffer[l]`` / ``v_buffer[l]`` of ``[slots, kv_heads, head_dim]``. A flat
  slot index needs a uniform slot stride, which the CONTIGUOUS layout only has when
  ``block_size == 1`` (SGLang's default page size): otherwise use PER_LAYER;
* MLA latent (``num_buffers == 1``), per layer: ``[num_blocks, block_size, 1, head_dim]``.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.core.geometry import KVGeometry, Layout
from workbench.core.vspace import KVSpace
from workbench.errors import ConfigError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "fp8": torch.float8_e4m3fn, "int8": torch.int8, "uint8": torch.uint8}


class _DevicePointer:
    """The minimal ``__cuda_array_interface__`` (v3) exporter for a raw byte range."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "strides": None,
            "version": 3, "stream": None,  # no stream: nothing to synchronize with
        }


def from_pointer(ptr: int, nbytes: int, device_index: int = 0) -> torch.Tensor:
    """A uint8 CUDA tensor over ``[ptr, ptr+nbytes)``, sharing the memory (never a copy)."""
    with torch.cuda.device(device_index):
        t = torch.as_tensor(_DevicePointer(ptr, nbytes), device=f"cuda:{device_index}")
    if t.data_ptr() != ptr or t.numel() != nbytes:
        raise RuntimeError(f"torch copied the range at {ptr:#x} instead of viewing it")
    return t


def _dtype(geo: KVGeometry, dtype: torch.dtype | str | None) -> torch.dtype:
    dt = DTYPES[dtype] if isinstance(dtype, str) else (dtype or _default(geo))
    if torch.empty((), dtype=dt).element_size() != geo.dtype_bytes:
        raise ConfigError(f"dtype {dt}", f"the pool was sized for {geo.dtype_bytes}-byte elements",
                          "pass a dtype of that size or rebuild the geometry")
    return dt


def _default(geo: KVGeometry) -> torch.dtype:
    return {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32}[geo.dtype_bytes]


class KVTensors:
    """Typed views over one :class:`KVSpace` (keep it alive as long as the views are used)."""

    def __init__(self, space: KVSpace, dtype: torch.dtype | str | None = None,
                 device_index: int | None = None):
        self.space = space
        self.geometry = g = space.geometry
        self.dtype = _dtype(g, dtype)
        index = device_index if device_index is not None else getattr(space.device, "index", 0)
        self.raw = from_pointer(space.base, space.size, index)  # uint8 over the reservation
        self.flat = self.raw.view(self.dtype)
        self._e = g.dtype_bytes

    def _elems(self, nbytes: int) -> int:
        return nbytes // self._e

    def _block_view(self, layer: int, buffer: int) -> tuple[list[int], list[int], int]:
        """Shape, strides (elements) and offset of ``[num_blocks, block_size, heads, head_dim]``."""
        g = self.geometry
        v = self.space.view(layer, buffer)
        shape = [g.num_blocks, g.block_size, g.kv_heads, g.head_dim]
        strides = [self._elems(v.block_stride), g.kv_heads * g.head_dim, g.head_dim, 1]
        return shape, strides, self._elems(v.offset)

    # -- views -------------------------------------------------------------------------------
    def block_tensor(self, layer: int, buffer: int) -> torch.Tensor:
        """``[num_blocks, block_size, kv_heads, head_dim]`` of one layer's K (0) or V (1)."""
        shape, strides, off = self._block_view(layer, buffer)
        return self.flat.as_strided(shape, strides, off)

    def vllm_layer(self, layer: int) -> torch.Tensor:
        """vLLM's FlashAttention cache of one layer: ``[2, num_blocks, block_size, heads, dim]``."""
        g = self.geometry
        if g.num_buffers != 2:
            raise ConfigError("a vLLM [2, ...] cache", "the pool has one (MLA) buffer",
                              "use mla_layer() for MLA pools")
        shape, strides, off = self._block_view(layer, 0)
        kv_stride = self._elems(self.space.view(layer, 1).offset) - off
        return self.flat.as_strided([2, *shape], [kv_stride, *strides], off)

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
                "single stride", "use Layout.PER_LAYER, or block_size=1 (SGLang page size 1)")
        shape = [g.num_slots, g.kv_heads, g.head_dim]
        slot_stride = self._elems(v.block_stride) if g.block_size == 1 else g.kv_heads * g.head_dim
        return self.flat.as_strided(shape, [slot_stride, g.head_dim, 1], self._elems(v.offset))

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


__all__ = ["DTYPES", "KVTensors", "Layout", "from_pointer", "kv_tensors"]
