"""Zero-copy tensors over a pool's virtual KV range on the host device (the SGLang adapter's and
the tests' entry points). The layout arithmetic is :mod:`workbench.tensors`, shared with CUDA.

An engine keeps one tensor per layer (K and V as separate tensors or as a leading dim of 2); the
workbench hands it strided views into the reservation, so a block's bytes are the bytes a page map
backs. Unmapped blocks read as zeros and fault on write: an engine writing a block it was not
given crashes loudly instead of corrupting someone else's cache.
"""

from __future__ import annotations

from typing import Any

from workbench.core.vspace import KVSpace


def layer_buffer_view(space: KVSpace, layer: int, buffer: int, dtype: Any,
                      shape_per_block: tuple[int, ...] | None = None):
    """``[num_blocks, block_size, kv_heads, head_dim]`` (or ``[num_blocks, *shape_per_block]``)
    tensor over one layer's K (buffer 0) or V (buffer 1)."""
    from workbench.tensors import KVTensors

    return KVTensors(space, dtype).block_tensor(layer, buffer, shape_per_block)
