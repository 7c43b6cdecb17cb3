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
    assert kbuf.shape == (eng.kv.geometry.num_slots, CFG.num_kv_heads, CFG.head_dim)
    assert kbuf.data_ptr() == eng.kv.k[0].data_ptr()  # a view, not a copy
    assert eng.generate(PROMPTS[:2], 8) == _engine(model).generate(PROMPTS[:2], 8)


def test_chunked_prefill_and_small_batches_finish(model):
    eng = _engine(model, max_batched_tokens=7, max_num_seqs=2)
    out = eng.generate(PROMPTS, 6)
    assert [len(o) for o in out] == [6] * len(PROMPTS)
    assert max(s.num_prefill_tokens + s.num_decode for s in eng.stats.steps) <= 7


def test_allocation_miss_preempts_and_never_crashes(model):
    block_all = 16 * CFG.kv_token_bytes
    eng = _engine(model, kv_bytes=5 * block_all, block_size=8)  # 9 usable blocks of 8 tokens
    out = eng.generate(PROMPTS, 16)
    assert [len(o) for o in out] == [16] * len(PROMPTS)
    assert eng.num_preemptions > 0
    assert eng.scheduler.stats.misses > 0
    assert eng.kv.manager.used_blocks == 0
    eng.kv.manager.check_invariants()


def test_request_larger_than_pool_is_refused(model):
    eng = _engine(model, kv_bytes=4 * 16 * CFG.kv_token_bytes)
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
