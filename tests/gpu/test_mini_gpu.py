"""The mini engine on a CUDA GPU: VMM-backed KV (workbench.gpu) must give what static KV gives."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from workbench.mini.attention import (  # noqa: E402
    paged_decode,
    reference_decode,
    slots_of,
    softmax_scale,
    triton_available,
)
from workbench.mini.engine import Engine, EngineConfig  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import build_model, get_config  # noqa: E402

# Bigger than "tiny" so bf16 rounding has room to matter, small enough to build in a second.
CFG = get_config("tiny", hidden_size=512, num_layers=4, q_heads=8, kv_heads=2,
                 head_dim=64, intermediate_size=1024, vocab_size=4096)
PROMPTS = [[(i * 31 + j * 17) % 4096 for j in range(7 + i * 29)] for i in range(12)]


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, "cuda")


def _run(model, style, backend, kv_bytes=64 << 20, n=24, **kw):
    bs = 16 if style == "block" else 1
    eng = Engine(CFG, KVSpec(style=style, backend=backend, kv_bytes=kv_bytes, block_size=bs),
                 "cuda", EngineConfig(**kw), model=model)
    try:
        out = eng.generate(PROMPTS, n)
        assert eng.kv.manager.used_blocks == 0
        eng.kv.manager.check_invariants()
        return out, eng.num_preemptions
    finally:
        eng.close()


def test_vmm_and_static_and_both_styles_agree_token_for_token(model):
    ref, _ = _run(model, "block", "static")
    assert all(len(o) == 24 for o in ref)
    for style in ("block", "token"):
        for backend in ("static", "vmm"):
            out, _ = _run(model, style, backend)
            assert out == ref, (style, backend)


def test_preemption_under_a_small_vmm_pool(model):
    # 40 blocks of 16 tokens: the 12 prompts need far more, so the scheduler preempts.
    small = 40 * 16 * CFG.kv_bytes_per_token
    out, pre = _run(model, "block", "vmm", kv_bytes=small, n=48)
    assert all(len(o) == 48 for o in out) and pre > 0
    out_s, pre_s = _run(model, "block", "static", kv_bytes=small, n=48)
    assert out_s == out and pre_s == pre  # same schedule, same memory contents -> same tokens


@pytest.mark.skipif(not triton_available(torch.device("cuda")), reason="needs Triton")
@pytest.mark.parametrize("entry,bs,nh,nkv,hd", [(16, 16, 32, 8, 128), (1, 1, 32, 8, 128),
                                                 (1, 16, 8, 2, 64), (16, 16, 4, 4, 64)])
def test_triton_paged_decode_matches_reference(entry, bs, nh, nkv, hd):
    for trial in range(3):  # fresh inputs each time
        gen = torch.Generator(device="cuda").manual_seed(100 + trial)
        b, max_len = 9, 700
        lens = torch.randint(1, max_len, (b,), device="cuda", generator=gen)
        lens[0], lens[1] = 1, max_len
        n_entries = -(-max_len // entry)
        tokens_needed = b * n_entries * entry
        nb = tokens_needed // bs + 8
        kc = torch.randn(nb, bs, nkv, hd, device="cuda", generator=gen, dtype=torch.bfloat16)
        vc = torch.randn(nb, bs, nkv, hd, device="cuda", generator=gen, dtype=torch.bfloat16)
        units = nb * bs // entry  # table entries address blocks (entry==bs) or slots (entry==1)
        perm = torch.randperm(units - 1, device="cuda", generator=gen)[: b * n_entries] + 1
        table = perm.view(b, n_entries).to(torch.int32)
        q = torch.randn(b, nh, hd, device="cuda", generator=gen, dtype=torch.bfloat16)
        scale = softmax_scale(hd)
        out = paged_decode(q, kc, vc, table, lens, entry, scale, impl="triton")
        ref = reference_decode(q.double(), kc.double(), vc.double(), table, lens, entry, scale)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, err
        assert not out.isnan().any()
        assert slots_of(table, lens, entry, max_len).max() < nb * bs


def test_server_streams_from_vmm_kv_on_gpu(model):
    from workbench.mini.client import Timed, complete, run_workload
    from workbench.mini.server import shutdown_server, start_server

    eng = Engine(CFG, KVSpec(style="block", backend="vmm", kv_bytes=64 << 20), "cuda",
                 model=model)
    srv = start_server(eng, "127.0.0.1", 0)  # the engine steps on the server's own thread
    try:
        one = complete(srv.url, PROMPTS[3], 16)
        assert one.ok and one.completion_tokens == 16, one.error
        res = run_workload(srv.url, [Timed(0.005 * i, PROMPTS[i % 12], 12) for i in range(24)])
        assert all(r.ok and r.completion_tokens == 12 for r in res), [r.error for r in res]
    finally:
        shutdown_server(srv)
        eng.close()
    ref = Engine(CFG, KVSpec(kv_bytes=64 << 20), "cuda", model=model)
    try:
        from workbench.mini.server import decode

        assert decode(ref.generate([PROMPTS[3]], 16)[0]) == one.text
    finally:
        ref.close()
