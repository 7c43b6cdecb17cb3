"""The fused Triton kernels (workbench.mini.fused) against their torch versions on a GPU: fresh
random inputs, decode-sized and odd shapes, strided rows; the residual sum is bitwise the torch
add, everything else agrees to bf16 rounding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from workbench.mini import fused  # noqa: E402
from workbench.mini.attention import DenseContext, softmax_scale  # noqa: E402
from workbench.mini.model import Rotary, build_model, get_config  # noqa: E402

if torch.cuda.is_available() and fused.triton is None:
    pytest.skip("the fused kernels need Triton", allow_module_level=True)


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    assert torch.isfinite(got).all()
    return float((got - ref).norm() / ref.norm())


@pytest.mark.parametrize("rows,dim", [(1, 4096), (7, 1000), (128, 4096), (64, 512)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_torch(rows, dim, with_residual):
    g = torch.Generator(device="cuda").manual_seed(rows * dim)
    h = torch.randn(rows, dim, device="cuda", generator=g).bfloat16()
    r = torch.randn(rows, dim, device="cuda", generator=g).bfloat16() if with_residual else None
    w = (torch.rand(dim, device="cuda", generator=g) + 0.5).bfloat16()
    out_t, res_t = fused.add_rms_norm(h.clone(), None if r is None else r.clone(), w, 1e-5,
                                      impl="torch")
    r_in = None if r is None else r.clone()
    out, res = fused.add_rms_norm(h.clone(), r_in, w, 1e-5, impl="triton")
    assert torch.equal(res, res_t)  # the residual add rounds exactly as torch's
    if r_in is not None:
        assert res.data_ptr() == r_in.data_ptr()  # in place
    assert _rel(out, out_t) < 4e-3
    torch.testing.assert_close(out, out_t, rtol=1.6e-2, atol=2e-2)


def test_add_rms_norm_on_strided_rows_updates_the_residual_in_place():
    g = torch.Generator(device="cuda").manual_seed(3)
    h = torch.randn(9, 2, 256, device="cuda", generator=g).bfloat16()[:, 0]  # row stride 512
    r = torch.randn(9, 256, device="cuda", generator=g).bfloat16()
    w = (torch.rand(256, device="cuda", generator=g) + 0.5).bfloat16()
    want_res = h + r
    ref, _ = fused.add_rms_norm(h, r.clone(), w, 1e-5, impl="torch")
    out, res = fused.add_rms_norm(h, r, w, 1e-5, impl="triton")
    assert res is r and torch.equal(r, want_res)
    assert out.shape == (9, 256)
    assert _rel(out, ref) < 4e-3


@pytest.mark.parametrize("rows,inter", [(1, 14336), (5, 1000), (128, 14336)])
def test_silu_mul_matches_torch(rows, inter):
    g = torch.Generator(device="cuda").manual_seed(rows + inter)
    x = (3 * torch.randn(rows, 2 * inter, device="cuda", generator=g)).bfloat16()
    got = fused.silu_mul(x, impl="triton")
    ref = fused.silu_mul(x, impl="torch")
    assert got.shape == ref.shape == (rows, inter)
    assert _rel(got, ref) < 4e-3
    torch.testing.assert_close(got, ref, rtol=1.6e-2, atol=2e-2)


@pytest.mark.parametrize("tokens,nh,nkv,hd", [(128, 32, 8, 128), (3, 8, 2, 64), (1, 5, 1, 32)])
def test_rotate_in_place_matches_torch_and_leaves_v(tokens, nh, nkv, hd):
    g = torch.Generator(device="cuda").manual_seed(tokens * nh)
    rot = Rotary(hd, 500_000.0, 8192).to("cuda")
    pos = torch.randint(0, 8192, (tokens,), device="cuda", generator=g)
    qkv = torch.randn(tokens, nh + 2 * nkv, hd, device="cuda", generator=g).bfloat16()
    ref = qkv.clone()
    fused.rotate_(ref[:, :nh + nkv], pos, rot.cos, rot.sin, impl="torch")
    got = qkv.clone()
    fused.rotate_(got[:, :nh + nkv], pos, rot.cos, rot.sin, impl="triton")
    assert torch.equal(got[:, nh + nkv:], qkv[:, nh + nkv:])  # V heads untouched
    assert _rel(got, ref) < 4e-3
    torch.testing.assert_close(got, ref, rtol=1.6e-2, atol=2e-2)


def test_model_logits_with_fused_kernels_match_torch_kernels():
    cfg = get_config("tiny", hidden_size=512, num_layers=4, q_heads=8, kv_heads=2,
                     head_dim=64, intermediate_size=1024, vocab_size=4096)
    model = build_model(cfg, "cuda")
    ids = torch.randint(0, 4096, (40,), device="cuda")
    pos = torch.arange(40, device="cuda")
    ctx = DenseContext(softmax_scale(cfg.head_dim))
    model.use_kernels("torch")
    ref = model(ids, pos, ctx)
    model.use_kernels("triton")
    got = model(ids, pos, ctx)
    assert _rel(got, ref) < 2e-2
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.9  # near-ties may flip under bf16 rounding; most rows keep their argmax
