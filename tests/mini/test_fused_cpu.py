"""The fused kernels' torch fallbacks (what runs off CUDA) against float64 references, and the
kernel choice: ``auto`` is torch on a CPU, ``triton`` refuses there in one line."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from workbench.errors import ConfigError  # noqa: E402
from workbench.mini import fused  # noqa: E402
from workbench.mini.attention import DenseContext, softmax_scale  # noqa: E402
from workbench.mini.model import Rotary, build_model, get_config  # noqa: E402


def _rms64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def test_add_rms_norm_adds_in_place_then_normalises():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(5, 96, generator=g).bfloat16()
    r = torch.randn(5, 96, generator=g).bfloat16()
    w = (torch.rand(96, generator=g) + 0.5).bfloat16()
    want_sum = h + r  # bf16 add: fp32 sum rounded once
    keep = r
    out, res = fused.add_rms_norm(h, r, w, 1e-5, impl="torch")
    assert res is keep and torch.equal(res, want_sum)  # the residual's own storage
    ref = _rms64(want_sum, w, 1e-5)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.double(), ref, rtol=8e-3, atol=1e-6)  # one bf16 rounding


def test_add_rms_norm_without_residual_starts_it():
    h = torch.randn(3, 64, dtype=torch.float32)
    w = torch.ones(64)
    out, res = fused.add_rms_norm(h, None, w, 1e-6, impl="auto")  # auto on a CPU: torch
    assert res is h
    assert torch.allclose(out.double(), _rms64(h, w, 1e-6), rtol=1e-5, atol=1e-7)


def test_silu_mul_of_gate_and_up_halves():
    x = torch.randn(4, 2 * 48, dtype=torch.float64)
    got = fused.silu_mul(x, impl="torch")
    g, u = x[:, :48], x[:, 48:]
    assert got.shape == (4, 48)
    assert torch.allclose(got, g / (1 + torch.exp(-g)) * u, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 6), heads=st.integers(1, 5), half=st.sampled_from([1, 2, 4, 8]),
       seed=st.integers(0, 2**16))
def test_rotate_is_a_complex_rotation_by_position(tokens, heads, half, seed):
    g = torch.Generator().manual_seed(seed)
    rot = Rotary(2 * half, 10_000.0, 64)
    pos = torch.randint(0, 64, (tokens,), generator=g)
    x = torch.randn(tokens, heads, 2 * half, generator=g)
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    inv = 1.0 / 10_000.0 ** (torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half))
    want = z * torch.polar(torch.ones(tokens, 1, half, dtype=torch.float64),
                           pos.double()[:, None, None] * inv)
    got = fused.rotate_(x.clone(), pos, rot.cos, rot.sin, impl="torch")
    assert torch.allclose(got[..., :half].double(), want.real, atol=1e-5)
    assert torch.allclose(got[..., half:].double(), want.imag, atol=1e-5)
    # rows gathered once per forward (positions=None) give the same numbers
    same = fused.rotate_(x.clone(), None, rot.cos[pos], rot.sin[pos])
    assert torch.equal(same, got)


def test_rotate_writes_through_a_strided_view_and_leaves_the_rest():
    rot = Rotary(8, 500_000.0, 32)
    qkv = torch.randn(3, 6, 8).bfloat16()
    v_before = qkv[:, 4:].clone()
    qk_before = qkv[:, :4].clone()
    fused.rotate_(qkv[:, :4], torch.tensor([0, 5, 9]), rot.cos, rot.sin)
    assert torch.equal(qkv[:, 4:], v_before)
    assert torch.equal(qkv[0, :4], qk_before[0])  # position 0 is the identity
    assert not torch.equal(qkv[1:, :4], qk_before[1:])
    pair = qkv[1:, :4].float()
    before = qk_before[1:].float()
    norms = pair[..., :4].pow(2) + pair[..., 4:].pow(2)
    assert torch.allclose(norms, before[..., :4].pow(2) + before[..., 4:].pow(2), rtol=2e-2)


def test_kernel_choice_refuses_triton_off_cuda_and_unknown_names():
    x = torch.zeros(2, 4)
    assert fused.use_triton(x, "auto") is False and fused.use_triton(x, "torch") is False
    with pytest.raises(ConfigError, match="need Triton and a CUDA tensor"):
        fused.use_triton(x, "triton")
    with pytest.raises(ConfigError, match="is not one of"):
        fused.silu_mul(torch.zeros(2, 4), impl="fast")


def test_model_kernel_switch_is_torch_on_cpu_and_checked():
    cfg = get_config("tiny")
    model = build_model(cfg, "cpu")
    ids = torch.tensor([5, 9, 2, 77, 31])
    ctx = DenseContext(softmax_scale(cfg.head_dim))
    auto = model(ids, torch.arange(5), ctx)
    model.use_kernels("torch")
    assert all(m.kernels == "torch" for m in model.modules() if hasattr(m, "kernels"))
    assert torch.equal(model(ids, torch.arange(5), ctx), auto)
    last = model(ids, torch.arange(5), ctx, torch.tensor([4]))
    # rows picked before the final add + norm (a 1-row matmul may sum in another order)
    assert last.shape == (1, cfg.vocab_size)
    assert torch.allclose(last, auto[4:], rtol=1e-2, atol=1e-2)
    assert math.isfinite(float(auto.abs().max()))
    with pytest.raises(ConfigError, match="is not one of"):
        model.use_kernels("cuda")
