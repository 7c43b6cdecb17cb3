"""The mini engine on CPU with the tiny model: paged KV must compute what dense attention does."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from workbench.errors import ConfigError  # noqa: E402
from workbench.mini.attention import (  # noqa: E402
    DenseContext,
    paged_decode,
    slots_of,
    softmax_scale,
)
from workbench.mini.engine import Engine, EngineConfig  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import build_model, get_config  # noqa: E402

CFG = get_config("tiny")
PROMPTS = [[(i * 7 + j * 3) % 256 for j in range(5 + i * 4)] for i in range(4)]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the host VMM device needs Linux memfd")


@pytest.fixture(scope="module")
def model():
    return build_model(CFG)


def _engine(model, style="block", backend="static", kv_bytes=8 << 20, **kw):
    bs = kw.pop("block_size", 16 if style == "block" else 1)
    return Engine(CFG, KVSpec(style=style, backend=backend, kv_bytes=kv_bytes, block_size=bs),
                  model=model, cfg=EngineConfig(**kw))


def _dense_greedy(model, prompt, n):
    toks = list(prompt)
    ctx = DenseContext(softmax_scale(CFG.head_dim))
    for _ in range(n):
        logits = model(torch.tensor(toks), torch.arange(len(toks)), ctx)
        toks.append(int(logits[-1].argmax()))
    return toks[len(prompt):]


def test_paged_engine_matches_dense_greedy(model):
    eng = _engine(model)
    out = eng.generate(PROMPTS[:2], 10)
    assert out == [_dense_greedy(model, p, 10) for p in PROMPTS[:2]]
    eng.close()


@pytest.mark.parametrize("backend", ["static", pytest.param("vmm", marks=linux_only)])
def test_styles_and_backends_agree_token_for_token(model, backend):
    ref = _engine(model).generate(PROMPTS, 10)
    for style in ("block", "token"):
        eng = _engine(model, style=style, backend=backend)
        assert eng.generate(PROMPTS, 10) == ref, (style, backend)
        assert eng.kv.manager.used_blocks == 0  # every finished sequence gave its blocks back
        eng.kv.manager.check_invariants()
        eng.close()


def test_token_style_uses_slot_buffers(model):
    eng = _engine(model, style="token", block_size=4)
    kbuf, _ = eng.kv.token_buffers(0)
    assert kbuf.shape == (eng.kv.geometry.num_slots, CFG.kv_heads, CFG.head_dim)
    assert kbuf.data_ptr() == eng.kv.k[0].data_ptr()  # a view, not a copy
    assert eng.generate(PROMPTS[:2], 8) == _engine(model).generate(PROMPTS[:2], 8)


def test_chunked_prefill_and_small_batches_finish(model):
    eng = _engine(model, max_batched_tokens=7, max_num_seqs=2)
    out = eng.generate(PROMPTS, 6)
    assert [len(o) for o in out] == [6] * len(PROMPTS)
    assert max(s.num_prefill_tokens + s.num_decode for s in eng.stats.steps) <= 7


def test_allocation_miss_preempts_and_never_crashes(model):
    block_all = 16 * CFG.kv_bytes_per_token
    eng = _engine(model, kv_bytes=5 * block_all, block_size=8)  # 9 usable blocks of 8 tokens
    out = eng.generate(PROMPTS, 16)
    assert [len(o) for o in out] == [16] * len(PROMPTS)
    assert eng.num_preemptions > 0
    assert eng.scheduler.stats.misses > 0
    assert eng.kv.manager.used_blocks == 0
    eng.kv.manager.check_invariants()


def test_request_larger_than_pool_is_refused(model):
    eng = _engine(model, kv_bytes=4 * 16 * CFG.kv_bytes_per_token)
    with pytest.raises(ConfigError):
        eng.add_request(list(range(100)), 10)
    with pytest.raises(ConfigError):
        eng.add_request([], 10)
    with pytest.raises(ConfigError):
        eng.add_request([CFG.vocab_size], 1)


def test_seeded_sampling_is_reproducible(model):
    a = _engine(model).generate(PROMPTS[:2], 6, temperature=0.8, seed=7)
    b = _engine(model).generate(PROMPTS[:2], 6, temperature=0.8, seed=7)
    assert a == b


@pytest.mark.parametrize("entry", [1, 4])
def test_paged_decode_matches_float64_reference(entry):
    gen = torch.Generator().manual_seed(1)
    nb, bs, nkv, hd, nh = 40, 4, 2, 32, 8
    kc = torch.randn(nb, bs, nkv, hd, generator=gen).bfloat16()
    vc = torch.randn(nb, bs, nkv, hd, generator=gen).bfloat16()
    lens = torch.tensor([1, 7, 16, 23])
    perm = torch.randperm(nb - 1, generator=gen) + 1  # scattered blocks, never the null block
    width = 6 * (bs // entry)
    if entry == bs:
        table = perm[: 4 * 6].view(4, 6)
    else:  # token slots: each position's own slot, scattered
        table = (perm[: 4 * 6].view(4, 6, 1) * bs + torch.arange(bs)).view(4, width)
    q = torch.randn(4, nh, hd, generator=gen).bfloat16()
    scale = softmax_scale(hd)
    out = paged_decode(q, kc, vc, table, lens, entry, scale, impl="torch").double()
    for b in range(4):
        slots = slots_of(table[b:b + 1], lens[b:b + 1], entry, int(lens[b]))[0]
        k = kc[slots // bs, slots % bs].double().repeat_interleave(nh // nkv, 1)
        v = vc[slots // bs, slots % bs].double().repeat_interleave(nh // nkv, 1)
        p = torch.einsum("hd,lhd->hl", q[b].double(), k) * scale
        ref = torch.einsum("hl,lhd->hd", p.softmax(-1), v)
        err = (out[b] - ref).norm() / ref.norm()
        assert err < 1e-2, err


def test_prefill_attention_stays_off_cudnn_with_one_masked_path(monkeypatch):
    """cuDNN attention compiles a plan per new prefill shape (1 s, then 50-700 ms each on the
    H200): prefill SDPA runs with cuDNN switched off. A whole prompt and a chunk over earlier
    context both pass their mask (one kernel for both, so a prefix-cache hit gives the
    recompute's tokens), and both equal explicit-mask attention."""
    import workbench.mini.attention as att

    seen = []
    real = att.F.scaled_dot_product_attention

    def spy(*a, **kw):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), kw["attn_mask"] is None,
                     kw.get("is_causal", False)))
        return real(*a, **kw)

    monkeypatch.setattr(att.F, "scaled_dot_product_attention", spy)
    g = torch.Generator().manual_seed(0)
    nh, nkv, d, bs = 4, 2, 8, 4
    kc = torch.randn(8, bs, nkv, d, generator=g)
    vc = torch.randn(8, bs, nkv, d, generator=g)
    q = torch.randn(9, nh, d, generator=g)  # rows 0..5: a whole 6-token prompt; 6..8: a chunk
    k = torch.randn(9, nkv, d, generator=g)
    v = torch.randn(9, nkv, d, generator=g)
    whole = att.PrefillSeg(0, 6, 6, torch.arange(4, 10))
    chunk = att.PrefillSeg(6, 3, 7, torch.arange(20, 27))
    wslots = torch.cat([torch.arange(4, 10), torch.arange(24, 27)])
    ctx = att.AttnContext([kc], [vc], wslots, 0, None, None, bs, [whole, chunk], 0.3)
    out = ctx.attend(0, q, k, v)
    assert seen == [(False, False, False), (False, False, False)]
    assert torch.backends.cuda.cudnn_sdp_enabled()  # only inside the prefill
    for p in (whole, chunk):
        ks = att.gather_kv(kc, p.slots).transpose(0, 1)[None]
        vs = att.gather_kv(vc, p.slots).transpose(0, 1)[None]
        qpos = torch.arange(p.ctx_len - p.q_len, p.ctx_len)
        mask = torch.arange(p.ctx_len)[None, :] <= qpos[:, None]
        ref = real(q[p.row:p.row + p.q_len].transpose(0, 1)[None], ks, vs, attn_mask=mask,
                   scale=0.3, enable_gqa=True)[0].transpose(0, 1)
        torch.testing.assert_close(out[p.row:p.row + p.q_len], ref)
