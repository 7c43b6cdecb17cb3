"""Fused element-wise kernels of the decoder: residual add + RMSNorm, SiLU x up, rotary in place.

A decode step at batch 128 moves about 1 MB of activations per element-wise op, so each op costs
its launch and ramp, not its bytes. The torch versions take several kernels each (fp32 casts, a
norm, a cast back, the residual add; RoPE's halves, products, concat and cast), about 20 a layer;
these take one each, three to four a layer. Each computes what its torch version computes: fp32
arithmetic, bf16 rounding where the torch version rounds (the residual sum, SiLU's output, the
results), so the two agree to bf16 rounding (``tests/gpu/test_fused_gpu.py``).

``impl``: ``"triton"`` (CUDA with Triton), ``"torch"`` (anywhere), or ``"auto"``: Triton where
the tensor is on CUDA and Triton imports, torch otherwise (CPU CI has no Triton).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from workbench.errors import ConfigError

try:  # Triton is optional: CPU CI has none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the host
    triton = None

KERNELS = ("auto", "triton", "torch")


def use_triton(x: torch.Tensor, impl: str) -> bool:
    """Whether ``impl`` means the Triton kernel for a tensor on ``x.device``."""
    if impl not in KERNELS:
        raise ConfigError(f"kernels={impl!r}", f"is not one of {KERNELS}",
                          "pass 'auto', 'triton' or 'torch'")
    able = triton is not None and x.device.type == "cuda"
    if impl == "triton" and not able:
        raise ConfigError(f"kernels='triton' on {x.device}", "the fused kernels need Triton and "
                          "a CUDA tensor", "use kernels='auto' (torch off CUDA) or 'torch'")
    return able and impl != "torch"


if triton is not None:

    @triton.jit
    def _add_rms_norm_kernel(h_ptr, r_ptr, out_ptr, w_ptr, n_cols, eps, stride_h, stride_r,
                             stride_o, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        # one row a program; the residual is updated in place (r += h, rounded like torch's add)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(h_ptr + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
            xr = (x + r).to(r_ptr.dtype.element_ty)
            tl.store(r_ptr + row * stride_r + cols, xr, mask=mask)
            x = xr.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (x * rstd * w).to(out_ptr.dtype.element_ty),
                 mask=mask)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_o, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0)
        # round SiLU to the activation dtype before the product, as torch's two ops do
        s = (g / (1.0 + tl.exp(-g))).to(u.dtype).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (s * u.to(tl.float32)).to(u.dtype), mask=mask)

    @triton.jit
    def _rotary_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, n_heads, stride_t, stride_h,
                       HALF: tl.constexpr, HEADS: tl.constexpr):
        # one token a program: every rotated head of it, halves (d, d + HALF) as pairs
        t = tl.program_id(0)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        h = tl.arange(0, HEADS)[:, None]
        d = tl.arange(0, HALF)[None, :]
        mask = h < n_heads
        p1 = x_ptr + t * stride_t + h * stride_h + d
        x1 = tl.load(p1, mask=mask, other=0.0)
        x2 = tl.load(p1 + HALF, mask=mask, other=0.0)
        c = tl.load(cos_ptr + pos * HALF + d)
        s = tl.load(sin_ptr + pos * HALF + d)
        a, b = x1.to(tl.float32), x2.to(tl.float32)
        tl.store(p1, (a * c - b * s).to(x1.dtype), mask=mask)
        tl.store(p1 + HALF, (b * c + a * s).to(x1.dtype), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """A 2-D view whose rows are contiguous (the kernels index a row by one stride)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def add_rms_norm(h: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += h`` (in place; ``residual = h`` when None), then ``(rms_norm(residual),
    residual)``. The norm is fp32 as Llama's, rounded once to ``h.dtype``."""
    if not use_triton(h, impl):
        residual = h if residual is None else residual.add_(h)
        w = weight.float()
        return F.rms_norm(residual.float(), w.shape, w, eps).to(h.dtype), residual
    n = h.shape[-1]
    hv = _rows(h)
    rv = hv if residual is None else _rows(residual)
    out = torch.empty_like(hv)
    if not hv.shape[0]:  # no rows (a step that samples nothing): nothing to launch
        return out.view(h.shape), h if residual is None else residual
    block = triton.next_power_of_2(n)
    _add_rms_norm_kernel[(hv.shape[0],)](
        hv, rv, out, weight, n, eps, hv.stride(0), rv.stride(0), out.stride(0),
        HAS_RES=residual is not None, BLOCK=block, num_warps=min(16, max(4, block // 512)))
    if residual is None:
        residual = h
    elif rv.data_ptr() != residual.data_ptr():  # a copy was summed: put it back
        residual.copy_(rv.view_as(residual))
    return out.view(h.shape), residual


def silu_mul(x: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """``silu(gate) * up`` of ``x = [gate | up]`` along the last dim (SwiGLU's activation)."""
    n = x.shape[-1] // 2
    if not use_triton(x, impl):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    xv = _rows(x)
    out = torch.empty(xv.shape[0], n, dtype=x.dtype, device=x.device)
    block = 1024
    if not xv.shape[0]:
        return out.view(*x.shape[:-1], n)
    _silu_mul_kernel[(xv.shape[0], triton.cdiv(n, block))](
        xv, out, n, xv.stride(0), out.stride(0), BLOCK=block, num_warps=4)
    return out.view(*x.shape[:-1], n)


def rotate_(x: torch.Tensor, positions: torch.Tensor | None, cos: torch.Tensor,
            sin: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """Rotary embedding in place, half-split pairs (Llama's HF layout). ``x: [T, heads, D]``
    (rows may be strided, the last dim contiguous), ``cos``/``sin``: fp32 ``[max_pos, D/2]``
    tables read at ``positions: [T]``; the torch path also takes ``positions=None`` with tables
    of one row per token (gathered once per forward, not per layer). Rotates in fp32, rounds
    once."""
    half = x.shape[-1] // 2
    if positions is None or not use_triton(x, impl):
        c, s = (cos, sin) if positions is None else (cos[positions], sin[positions])
        c, s = c[:, None, :], s[:, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        x.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))
        return x
    if x.stride(-1) != 1 or cos.stride(0) != half or sin.stride(0) != half:
        raise ConfigError("rotate_ inputs", "the kernel needs a contiguous last dim and "
                          "[max_pos, D/2] contiguous tables", "pass views of the qkv output "
                          "and the model's Rotary tables")
    t, heads = x.shape[0], x.shape[1]
    if t:
        _rotary_kernel[(t,)](x, positions, cos, sin, heads, x.stride(0), x.stride(1), HALF=half,
                             HEADS=triton.next_power_of_2(heads), num_warps=4)
    return x
