"""The host KV tier on a CUDA GPU: a prefix retrieved from pinned host memory into VMM-backed KV
gives the tokens a full recompute gives and an HBM (prefix-cache) hit gives."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from workbench.mini.engine import Engine, EngineConfig  # noqa: E402
from workbench.mini.hosttier import attach_host_tier  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import build_model, get_config  # noqa: E402

CFG = get_config("tiny", hidden_size=512, num_layers=4, q_heads=8, kv_heads=2,
                 head_dim=64, intermediate_size=1024, vocab_size=4096)
DOCS = [[(i * 131 + j * 17 + 5) % 4096 for j in range(300 + 97 * i)] for i in range(3)]
QS = [[7, 99, 1000, 3], [4000, 12], [55, 66, 77, 88, 99]]


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, "cuda")


def _engine(model, caching=False):
    return Engine(CFG, KVSpec(backend="vmm", kv_bytes=64 << 20, block_size=16), "cuda",
                  EngineConfig(prefix_caching=caching), model=model)


def test_pinned_retrieve_into_vmm_kv_gives_recompute_and_hbm_tokens(model):
    probes = [d + q for d, q in zip(DOCS, QS, strict=True)]
    warm = [d + [1, 2, 3] for d in DOCS]
    ref = _engine(model)
    full = ref.generate(probes, 16)
    hbm = _engine(model, caching=True)
    hbm.generate(warm, 2)
    assert hbm.generate(probes, 16) == full
    eng = _engine(model)
    conn = attach_host_tier(eng, capacity_bytes=32 << 20, chunk_tokens=64)
    assert conn.tier.pinned and conn.tier.store.is_pinned()
    eng.generate(warm, 2)
    assert eng.generate(probes, 16) == full
    row = eng.kv.block_rows().shape[1]
    for i, d in enumerate(DOCS):
        ld = conn.loads[f"cmpl-{3 + i}"]
        assert ld.tokens == len(d) // 64 * 64 and ld.nbytes == ld.tokens // 16 * row
    assert hbm.pool.reset_prefix_cache() > 0  # the prefix cache keeps its blocks until then
    for e in (ref, hbm, eng):
        assert e.kv.manager.used_blocks == 0
        e.close()
