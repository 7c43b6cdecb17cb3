"""The real PD handover on CUDA: prefill engine -> KV block copy -> decode engine gives the
colocated engine's greedy tokens and moves blocks x block bytes. ``gpus=1`` (both engines on
GPU 0, a copy within the device) runs on every GPU host; across two GPUs (a device-to-device
copy) runs where two are visible. The lab runs use the Llama-3.1-8B shape (random weights), the
direct pair test the ``tiny`` model."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from workbench.backends import cuda_device_count, probe  # noqa: E402
from workbench.errors import ConfigError  # noqa: E402
from workbench.labs import run_lab  # noqa: E402
from workbench.labs.pd_split.lab import PDSplitParams  # noqa: E402

pytestmark = [pytest.mark.gpu]

BLOCK_8B = 16 * 32 * 2 * 8 * 128 * 2  # 16 tokens x 32 layers x K,V x 8 heads x 128 dims x bf16


def _gpus() -> int:
    ok, why = probe("gpu")
    if not ok:
        pytest.skip(why)
    return cuda_device_count()


def _check(res, copy: str, shared: bool) -> None:
    print(res.markdown)
    rows = res.tables["handover"]
    assert [r["prompt_len"] for r in rows] == [100, 1000]
    for r in rows:
        assert r["tokens_equal"], r
        assert r["output_len"] == 16 and r["copy"] == copy
        assert r["blocks"] == -(-r["prompt_len"] // 16)
        assert r["transfer_bytes"] == r["blocks"] * BLOCK_8B > 0
        assert r["pd_ms"]["transfer"] > 0
    real = res.record.results["real"]
    assert real["block_bytes"] == BLOCK_8B and real["model"] == "llama-3.1-8b"
    assert real["shared"] is shared
    assert res.record.results["summary"]["leaked_blocks"] == 0
    assert res.record.verdict.startswith("supported")


@pytest.mark.timeout(300)
def test_lab_handover_on_one_gpu():
    _gpus()
    res = run_lab("pd-split", PDSplitParams(quick=True, gpus=1), "gpu")
    _check(res, "within one device", shared=True)
    assert "share one device here" in res.markdown


@pytest.mark.timeout(300)
def test_lab_handover_across_two_gpus():
    if _gpus() < 2:
        pytest.skip("needs two GPUs (one prefill, one decode)")
    res = run_lab("pd-split", PDSplitParams(quick=True, gpus=2), "gpu")
    _check(res, "device-to-device", shared=False)
    assert res.record.results["real"]["devices"] == {"prefill": "cuda:0", "decode": "cuda:1",
                                                     "colocated": "cuda:0"}


def test_two_gpus_on_a_one_gpu_host_are_refused_in_one_line():
    if _gpus() >= 2:
        pytest.skip("this host has two GPUs: nothing to refuse")
    with pytest.raises(ConfigError, match=r"--param gpus=1"):
        run_lab("pd-split", PDSplitParams(quick=True), "gpu")


@pytest.mark.timeout(300)
def test_pair_at_block_edges_frees_everything():
    n = _gpus()
    from workbench.labs.pd_split.real import models_on
    from workbench.mini.engine import Engine
    from workbench.mini.kv import KVSpec
    from workbench.mini.model import get_config
    from workbench.pd.kvcopy import on_device
    from workbench.pd.real import PDPair

    cfg = get_config("tiny")
    spec = KVSpec(backend="vmm", kv_bytes=32 << 20)
    prompts = [[(i * 7 + j * 13) % cfg.vocab_size for j in range(k)]
               for i, k in enumerate((1, 15, 16, 17, 33, 200))]
    decode_dev = "cuda:1" if n >= 2 else "cuda:0"
    models = models_on(cfg, ["cuda:0", decode_dev])
    engines = []
    for name, dev in (("colocated", "cuda:0"), ("prefill", "cuda:0"), ("decode", decode_dev)):
        with on_device(torch.device(dev)):
            engines.append(Engine(cfg, spec, dev, model=models[dev], name=name))
    colo, pre, dec = engines
    pair = PDPair(pre, dec)
    try:
        with on_device(colo.device):
            want = [colo.generate([p], 10)[0] for p in prompts]
        got = [pair.generate([p], 10)[0] for p in prompts]
        assert got == want
        for eng in engines:
            assert eng.kv.manager.used_blocks == 0, eng.scheduler.name
            eng.kv.manager.check_invariants()
        assert all(s.num_prefill_tokens == 0 for s in dec.stats.steps)
        block = 16 * cfg.kv_bytes_per_token
        for p, t in zip(prompts, pair.times.values(), strict=True):
            assert t.copy.nbytes == -(-len(p) // 16) * block
            assert t.copy_end <= t.released
    finally:
        pair.close()
        for eng in engines:
            eng.close()
