"""Attention over the paged KV cache: write K/V into slots, then attend through a table.

One table format serves both indexing styles. Row ``b`` of ``table`` lists entries that each cover
``entry_tokens`` consecutive positions of sequence ``b``; position ``t`` lives in cache slot
``table[b, t // E] * E + t % E`` and slot ``s`` is token ``s % block_size`` of block
``s // block_size``. vLLM's block table is ``E = block_size``; SGLang's token-slot table
(``req_to_token``) is ``E = 1``. The kernels walk positions in fixed tiles whatever ``E`` is, so the
two styles add up the same numbers in the same order: their outputs are bitwise equal.

Decode rows (one new token whose context is in the cache) go through :func:`paged_decode` (Triton on
CUDA, a gather-based torch version elsewhere); prefill chunks gather their context and use SDPA,
kept off its cuDNN backend (:data:`PREFILL_BACKENDS` says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:  # Triton is optional: CPU CI has none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the host
    triton = None


def slots_of(table: torch.Tensor, lens: torch.Tensor, entry_tokens: int, max_len: int
             ) -> torch.Tensor:
    """``[B, max_len]`` cache slot of every position (0 = null block's slot past each length)."""
    t = torch.arange(max_len, device=table.device)
    entry = table[:, (t // entry_tokens).clamp(max=table.shape[1] - 1)].long()
    slots = entry * entry_tokens + (t % entry_tokens)
    return torch.where(t[None, :] < lens[:, None], slots, torch.zeros_like(slots))


def gather_kv(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows of a ``[num_blocks, block_size, H, D]`` cache at ``slots`` (any shape)."""
    bs = cache.shape[1]
    return cache[slots // bs, slots % bs]


def reference_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     table: torch.Tensor, lens: torch.Tensor, entry_tokens: int,
                     scale: float, rows: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 attention of one query per sequence over its cached context (tests, CPU path).
    ``rows``: sequence ``b`` reads table row ``rows[b]`` (``req_to_token``), else row ``b``."""
    if rows is not None:
        table = table[rows]
    b, nh, d = q.shape
    nkv = k_cache.shape[2]
    max_len = int(lens.max())
    slots = slots_of(table, lens, entry_tokens, max_len)
    k = gather_kv(k_cache, slots).float()  # [B, L, nkv, D]
    v = gather_kv(v_cache, slots).float()
    qg = q.float().view(b, nkv, nh // nkv, d)
    s = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale
    mask = torch.arange(max_len, device=q.device)[None, :] < lens[:, None]
    s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    out = torch.einsum("bhgl,blhd->bhgd", s.softmax(-1), v)
    return out.reshape(b, nh, d)


if triton is not None:

    @triton.jit
    def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, o_ptr, table_ptr, rows_ptr, lens_ptr, scale,
                             stride_qb, stride_qh, stride_ob, stride_oh, stride_tb,
                             k_sb, k_st, k_sh, v_sb, v_st, v_sh,
                             GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                             ENTRY: tl.constexpr, BLOCK: tl.constexpr, TILE: tl.constexpr,
                             HAS_ROWS: tl.constexpr):
        # One program: one sequence x one KV head, all GROUP query heads of it (GQA), so each
        # K/V tile is read once per KV head. Online softmax over TILE positions at a time.
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        seq_len = tl.load(lens_ptr + b)
        if HAS_ROWS:  # req_to_token: this sequence's row of the persistent table
            trow = tl.load(rows_ptr + b).to(tl.int64)
        else:
            trow = b
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, HEAD_DIM)
        gmask = g < GROUP
        qh = kvh * GROUP + g
        q = tl.load(q_ptr + b * stride_qb + qh[:, None] * stride_qh + d[None, :],
                    mask=gmask[:, None], other=0.0)
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_sum = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        for start in range(0, seq_len, TILE):
            t = start + tl.arange(0, TILE)
            tmask = t < seq_len
            entry = tl.load(table_ptr + trow * stride_tb + t // ENTRY, mask=tmask, other=0)
            slot = entry.to(tl.int64) * ENTRY + t % ENTRY
            blk = slot // BLOCK
            off = slot % BLOCK
            k = tl.load(k_ptr + blk[:, None] * k_sb + off[:, None] * k_st + kvh * k_sh
                        + d[None, :], mask=tmask[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale  # [GROUP_PAD, TILE] in fp32
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m - m_new)
            l_sum = l_sum * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + blk[:, None] * v_sb + off[:, None] * v_st + kvh * v_sh
                        + d[None, :], mask=tmask[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        out = acc / l_sum[:, None]
        tl.store(o_ptr + b * stride_ob + qh[:, None] * stride_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=gmask[:, None])


# (TILE, num_warps, num_stages) of the decode kernel per (GROUP, HEAD_DIM, ENTRY, BLOCK): set by a
# measured sweep (workbench.bench.decode_kernel.tune) for the served shape; default otherwise.
# Graphs capture whichever is set when they are captured.
DECODE_TILING: dict[tuple[int, int, int, int], tuple[int, int, int]] = {}
DEFAULT_TILING = (64, 4, 2)


def triton_available(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 table: torch.Tensor, lens: torch.Tensor, entry_tokens: int, scale: float,
                 impl: str = "auto", rows: torch.Tensor | None = None,
                 tiling: tuple[int, int, int] | None = None) -> torch.Tensor:
    """Attention of one query per sequence ``q: [B, heads, D]`` over its paged context;
    with ``rows``, sequence ``b``'s entries are ``table[rows[b]]`` (no per-step gather)."""
    if impl == "auto":
        impl = "triton" if triton_available(q.device) else "torch"
    if impl == "torch":
        return reference_decode(q, k_cache, v_cache, table, lens, entry_tokens,
                                scale, rows).to(q.dtype)
    b, nh, d = q.shape
    nkv = k_cache.shape[2]
    group = nh // nkv
    out = torch.empty_like(q)
    table = table.to(torch.int32)
    lens = lens.to(torch.int32)
    tile, warps, stages = tiling or DECODE_TILING.get(
        (group, d, entry_tokens, k_cache.shape[1]), DEFAULT_TILING)
    _paged_decode_kernel[(b, nkv)](
        q, k_cache, v_cache, out, table, lens if rows is None else rows, lens, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), table.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=d,
        ENTRY=entry_tokens, BLOCK=k_cache.shape[1], TILE=tile, num_warps=warps, num_stages=stages,
        HAS_ROWS=rows is not None)
    return out


# SDPA's backends for prefill chunks: not cuDNN. On the H200 (torch 2.11, CUDA 13) SDPA picks
# cuDNN attention, which builds and compiles a plan for every new (q_len, ctx_len): 1.0 s the
# first time in a process, 50-700 ms for each new shape after (`python -m workbench.mini.warmup
# --profile`: aten::_cudnn_attention_forward), and a serving run meets a new prefill length at
# every preemption (recompute = prompt + generated tokens). The others are precompiled (on CUDA
# a masked chunk runs memory-efficient attention, on a CPU flash), and math accepts anything, so
# a call never fails.
PREFILL_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class PrefillSeg:
    """A prefill chunk: packed rows ``[row, row+q_len)``, positions ``ctx_len-q_len..ctx_len-1``."""

    row: int
    q_len: int
    ctx_len: int
    slots: torch.Tensor  # [ctx_len] cache slots of positions 0..ctx_len-1


class AttnContext:
    """Per-step attention metadata, shared by every layer of one forward pass.

    Packed rows are ``num_decode`` decode rows first, then the prefill chunks in ``prefills``.
    ``write_slots`` gives each row's cache slot (its own position).
    """

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], write_slots: torch.Tensor,
                 num_decode: int, table: torch.Tensor | None, lens: torch.Tensor | None,
                 entry_tokens: int, prefills: list[PrefillSeg], scale: float,
                 impl: str = "auto", rows: torch.Tensor | None = None):
        self.k, self.v = k, v
        bs = k[0].shape[1]
        self.wb, self.wo = write_slots // bs, write_slots % bs
        self.num_decode = num_decode
        # the kernel reads int32 lengths: cast once per step, not once per layer
        self.lens = None if lens is None else lens.to(torch.int32)
        self.table, self.entry_tokens = table, entry_tokens
        self.rows = rows  # decode row b reads table[rows[b]] (req_to_token), else table[b]
        self.prefills = prefills
        self.scale = scale
        self.impl = impl
        # Prefill masks depend only on the chunk, not the layer: build them once per step. A
        # whole prompt takes a mask too (not is_causal): that keeps it on the same SDPA kernel as
        # a chunk over cached context, so a prefix-cache hit gives the recompute's tokens.
        self._masks = [self._mask(p, k[0].device) for p in prefills]

    @staticmethod
    def _mask(p: PrefillSeg, device: torch.device) -> torch.Tensor:
        qpos = torch.arange(p.ctx_len - p.q_len, p.ctx_len, device=device)
        return torch.arange(p.ctx_len, device=device)[None, :] <= qpos[:, None]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> torch.Tensor:
        kc, vc = self.k[layer], self.v[layer]
        kc[self.wb, self.wo] = k
        vc[self.wb, self.wo] = v
        nd = self.num_decode
        if nd and nd == q.shape[0]:  # decode only (every graphed step): the kernel's output as is
            return paged_decode(q, kc, vc, self.table, self.lens, self.entry_tokens,
                                self.scale, self.impl, self.rows)
        out = torch.empty_like(q)
        if nd:
            out[:nd] = paged_decode(q[:nd], kc, vc, self.table, self.lens, self.entry_tokens,
                                    self.scale, self.impl, self.rows)
        if not self.prefills:
            return out
        with sdpa_kernel(PREFILL_BACKENDS):
            for p, mask in zip(self.prefills, self._masks, strict=True):
                qs = q[p.row:p.row + p.q_len].transpose(0, 1)[None]  # [1, H, q, D]
                ks = gather_kv(kc, p.slots).transpose(0, 1)[None]  # [1, Hkv, ctx, D]
                vs = gather_kv(vc, p.slots).transpose(0, 1)[None]
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                   scale=self.scale, enable_gqa=True)
                out[p.row:p.row + p.q_len] = o[0].transpose(0, 1)
        return out


def softmax_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


class DenseContext:
    """No cache: causal attention over one packed sequence (the reference the paged path must
    match; tests use it)."""

    def __init__(self, scale: float):
        self.scale = scale

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> torch.Tensor:
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], is_causal=True,
                                           scale=self.scale, enable_gqa=True)
        return o[0].transpose(0, 1)
