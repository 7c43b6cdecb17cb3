"""Zero-copy tensors over a pool's virtual KV range on the host device.

An engine keeps one tensor per layer (K and V as separate tensors or as a leading dim of 2); the
workbench hands it strided views into the reservation, so a block's bytes are the bytes a page map
backs. Unmapped blocks read as zeros and fault on write: an engine writing a block it was not
given crashes loudly instead of corrupting someone else's cache.
"""

from __future__ import annotations

from typing import Any

from workbench.core.vspace import KVSpace


def dtype_bytes(dtype: Any) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def layer_buffer_view(space: KVSpace, layer: int, buffer: int, dtype: Any,
                      shape_per_block: tuple[int, ...] | None = None):
    """``[num_blocks, block_size, kv_heads, head_dim]`` (or ``[num_blocks, *shape_per_block]``)
    tensor over one layer's K (buffer 0) or V (buffer 1)."""
    import torch

    g = space.geometry
    es = dtype_bytes(dtype)
    if g.dtype_bytes != es:
        raise ValueError(f"geometry has {g.dtype_bytes}-byte elements, dtype {dtype} has {es}")
    shape = shape_per_block or (g.block_size, g.kv_heads, g.head_dim)
    inner = 1
    for d in shape:
        inner *= d
    if inner * es != g.block_bytes:
        raise ValueError(f"block shape {shape} is {inner * es} bytes, the pool's block is "
                         f"{g.block_bytes}")
    flat = space.device.tensor(space.base, space.size, dtype)
    v = space.view(layer, buffer)
    strides = [v.block_stride // es]
    acc = 1
    for d in reversed(shape):
        strides.insert(1, acc)
        acc *= d
    return torch.as_strided(flat, (g.num_blocks, *shape), tuple(strides), v.offset // es)


def slot_view(space: KVSpace, layer: int, buffer: int, dtype: Any):
    """SGLang's per-layer buffer shape ``[num_slots, kv_heads, head_dim]``: slot ``s`` is token
    ``s % block_size`` of block ``s // block_size``. Needs blocks that are contiguous in a layer
    (PER_LAYER layout, or one block per page id) so that slots have one uniform stride."""
    g = space.geometry
    v = space.view(layer, buffer)
    if v.block_stride != g.block_bytes:
        raise ValueError("slot views need the per-layer layout (blocks back to back per layer); "
                         "set contiguous_layout=False for SGLang pools")
    t = layer_buffer_view(space, layer, buffer, dtype)
    return t.reshape(g.num_blocks * g.block_size, g.kv_heads, g.head_dim)
