"""Block vs token slot vs VMM page: the arithmetic every layer shares (seed 001 §3, §9).

Three units, three owners:

* a **block** (vLLM) holds ``block_size`` tokens of one layer's K (or V) buffer;
* a **token slot** (SGLang) is one token's entry; an SGLang *page* is ``page_tokens`` slots, so a
  paged SGLang allocator is a block allocator with ``block_size = page_tokens``;
* a **VMM page** is the unit of physical backing (default 2 MiB per layer per buffer). One page id
  backs the same byte range in every layer and buffer of a pool.

Byte counts here are *per layer per buffer* unless named otherwise (``*_id_bytes`` span every
layer and buffer). Blocks never straddle a page: page ``p`` holds blocks
``ceil(p*P/b) .. floor((p+1)*P/b) - 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from workbench.errors import ConfigError
from workbench.knobs import default
from workbench.units import MiB

# the pool knob's default, so a default config and a default geometry agree
DEFAULT_PAGE_SIZE: int = default("page_size")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "int8": 1}


class Layout(str, Enum):
    """How the pool's virtual range is laid out.

    ``CONTIGUOUS``: one reservation; page id ``p`` is a compound page of ``P * L * B`` bytes that
    interleaves every layer and buffer, so backing it is **one** map.
    ``PER_LAYER``: one reservation per layer holding K then V; backing page id ``p`` takes
    ``L * B`` maps of ``P`` bytes each.
    """

    CONTIGUOUS = "contiguous"
    PER_LAYER = "per_layer"


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """The KV geometry of one pool.

    ``num_buffers`` is 2 for MHA/GQA (K and V) and 1 for MLA (one latent buffer, where
    ``kv_heads = 1`` and ``head_dim = kv_lora_rank + rope_dim``).
    """

    num_layers: int
    kv_heads: int
    head_dim: int
    block_size: int = 16
    num_blocks: int = 1024
    num_buffers: int = 2
    dtype_bytes: int = 2
    page_size: int = DEFAULT_PAGE_SIZE
    layout: Layout = Layout.CONTIGUOUS

    def __post_init__(self) -> None:
        for name in ("num_layers", "kv_heads", "head_dim", "block_size", "num_blocks",
                     "dtype_bytes", "page_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name}={value!r}", "must be a positive integer",
                                  f"pass a positive integer for {name}")
        if self.num_buffers not in (1, 2):
            raise ConfigError(f"num_buffers={self.num_buffers}",
                              "a pool holds K and V (2, MHA/GQA) or one latent buffer (1, MLA)",
                              "use num_buffers=2 for MHA/GQA or 1 for MLA")
        object.__setattr__(self, "layout", Layout(self.layout))
        b, p = self.block_bytes, self.page_size
        if b > p:
            raise ConfigError(
                f"block of {b} bytes (block_size={self.block_size}, {self.kv_heads} heads x "
                f"{self.head_dim} x {self.dtype_bytes} B)",
                f"does not fit in a {p // MiB} MiB page",
                f"use block_size <= {p // self.token_bytes} or a page size of at least "
                f"{_round_up(b, MiB) // MiB} MiB")
        if p < 2 * b - math.gcd(p, b):
            raise ConfigError(
                f"page of {p} bytes with {b}-byte blocks",
                "some page would hold no whole block (blocks never straddle a page)",
                f"make the page size a multiple of {b} bytes or halve block_size")
        if self.num_blocks < 2:
            raise ConfigError(f"num_blocks={self.num_blocks}", "block 0 is the null block",
                              "ask for at least 2 blocks")

    # -- sizes -------------------------------------------------------------------------------
    @property
    def token_bytes(self) -> int:
        """Bytes one token slot takes in one layer's buffer."""
        return self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes one block takes in one layer's buffer."""
        return self.block_size * self.token_bytes

    @property
    def num_pages(self) -> int:
        """Page ids needed to back every block (the virtual capacity of the pool)."""
        return -(-self.num_blocks * self.block_bytes // self.page_size)

    @property
    def page_id_bytes(self) -> int:
        """Physical bytes behind one page id across every layer and buffer."""
        return self.page_size * self.num_layers * self.num_buffers

    @property
    def virtual_bytes(self) -> int:
        """Virtual address space the pool reserves (all layers and buffers)."""
        return self.num_pages * self.page_id_bytes

    @property
    def maps_per_page(self) -> int:
        """Driver map calls needed to back one page id."""
        return 1 if self.layout is Layout.CONTIGUOUS else self.num_layers * self.num_buffers

    @property
    def num_slots(self) -> int:
        """SGLang token slots the pool can address."""
        return self.num_blocks * self.block_size

    # -- block <-> page ------------------------------------------------------------------------
    def page_blocks(self, page: int) -> range:
        """Blocks wholly inside ``page`` (capped at ``num_blocks``)."""
        self._check_page(page)
        b, p = self.block_bytes, self.page_size
        start = -(-page * p // b)
        end = min(((page + 1) * p) // b, self.num_blocks)
        return range(start, max(start, end))

    def blocks_per_page(self, page: int) -> int:
        return len(self.page_blocks(page))

    def block_page(self, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise ConfigError(f"block {block}", f"outside 0..{self.num_blocks - 1}",
                              "use a block id this pool issued")
        return block * self.block_bytes // self.page_size

    def slot_block(self, slot: int) -> int:
        """The block (SGLang page) that holds token slot ``slot``."""
        return slot // self.block_size

    def _check_page(self, page: int) -> None:
        if not 0 <= page < self.num_pages:
            raise ConfigError(f"page {page}", f"outside 0..{self.num_pages - 1}",
                              "use a page id of this pool")

    # -- validation against the device and the engine's tensors -------------------------------
    def check_granularity(self, granularity: int) -> None:
        if self.page_size % granularity:
            raise ConfigError(f"page size {self.page_size} bytes",
                              f"not a multiple of the device granularity ({granularity} bytes)",
                              f"use a page size that is a multiple of {granularity // MiB or 1}"
                              f" {'MiB' if granularity >= MiB else 'bytes'}")

    def check_tensors(self, num_tensors: int, buffers_per_tensor: int) -> None:
        """The engine's KV tensors must match the pool: one per layer, ``num_buffers`` each."""
        if num_tensors != self.num_layers or buffers_per_tensor != self.num_buffers:
            raise ConfigError(
                f"{num_tensors} KV tensors x {buffers_per_tensor} buffers",
                f"the pool was sized for {self.num_layers} layers x {self.num_buffers} buffers",
                "build the pool with the engine's num_layers and num_buffers (2 for MHA/GQA, "
                "1 for MLA)")

    @classmethod
    def for_model(cls, *, num_layers: int, kv_heads: int, head_dim: int, mla: bool = False,
                  blocks_first: bool = False, **kw) -> KVGeometry:
        """``blocks_first``: K and V of a block side by side in one buffer per layer (a
        ``(blocks, 2, ...)`` KV tensor), so a token slot holds both and a page id is one buffer
        per layer."""
        if mla or blocks_first:
            return cls(num_layers=num_layers, kv_heads=1 if mla else kv_heads,
                       head_dim=head_dim if mla else 2 * head_dim, num_buffers=1, **kw)
        return cls(num_layers=num_layers, kv_heads=kv_heads, head_dim=head_dim, num_buffers=2,
                   **kw)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m
