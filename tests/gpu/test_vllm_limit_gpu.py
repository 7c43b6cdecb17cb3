"""vLLM 0.26 on a CUDA GPU (the recipe in ``gpu/vllm26``): what a memory limit costs, and CUDA
graphs. ``python -m workbench.bench.vllm_limit`` runs stock vLLM with N blocks and elastic vLLM
under a ``kvctl limit`` of N blocks' bytes at its default virtual budget, interleaved, each run
a fresh process; with ``--graphs`` both capture CUDA graphs (with the op stand-in, through its
``weak_ref_tensor``). Results go to ``$OUT`` when it is set; the time ratio is the bench's.

Skipped with one line where there is no CUDA GPU or no vLLM 0.26.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import backends

ROOT = Path(__file__).resolve().parents[2]
_ok, _why = backends.probe("cuda:0")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _ok, reason=f"no usable CUDA GPU here: {_why}")]
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="needs vLLM 0.26 (gpu/vllm26)")
needs_stub = pytest.mark.skipif(importlib.util.find_spec("opstub") is None,
                                reason="needs vLLM 0.26's op stand-in (gpu/vllm26 without ops.sh)")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    spec = importlib.util.spec_from_file_location("tinyllama",
                                                  ROOT / "tests/engines_real/tinyllama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.build(tmp_path_factory.mktemp("tiny") / "tiny-llama"))


def _bench(model: str, *extra: str) -> dict:
    out = os.environ.get("OUT") or str(ROOT / ".bench-out")
    args = ["--model", model, "--device", "cuda", "--blocks", "512", "--prompts", "64",
            "--prompt-len", "32", "--tokens", "200", "--block-size", "16", "--out", out,
            *extra]
    proc = subprocess.run([sys.executable, "-m", "workbench.bench.vllm_limit", *args],
                          capture_output=True, text=True, timeout=560)
    print(proc.stdout[-6000:])
    print(proc.stderr[-4000:], file=sys.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = "vllm_limit_cuda_graphs.json" if "--graphs" in extra else "vllm_limit_cuda.json"
    return json.loads((Path(out) / name).read_text())


@needs_vllm
@needs_stub
def test_weak_ref_tensor_shares_the_bytes_and_keeps_nothing_alive():
    import opstub
    import torch

    opstub.install("vllm_opstub_probe")
    base = torch.arange(4096, dtype=torch.float32, device="cuda").reshape(64, 64)
    t = base[3:, 5:40]  # an offset, strided view
    w = torch.ops._C.weak_ref_tensor(t)
    assert (w.data_ptr(), w.shape, w.stride(), w.dtype, w.device) == \
        (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)
    assert w.storage_offset() == 0 and torch.equal(w, t)
    w.fill_(-1.0)  # writes through it land in the original
    assert float(base[3, 5]) == -1.0 and float(base[2, 5]) == 2 * 64 + 5
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    owned = torch.empty(1 << 20, device="cuda")
    weak = torch.ops._C.weak_ref_tensor(owned)
    del owned  # the weak tensor does not keep the 4 MiB alive
    assert torch.cuda.memory_allocated() == before and weak.numel() == 1 << 20
    with pytest.raises(RuntimeError):
        torch.ops._C.weak_ref_tensor(torch.ones(2))


@needs_vllm
def test_under_a_limit_of_n_blocks_elastic_schedules_as_stock_given_n(model):
    # what the limit leaves is stock's N blocks, no fewer: the same steps and preemptions
    # (the time each takes is the bench's figure, not a test's)
    r = _bench(model, "--repeats", "1", "--warmup", "0")["summary"]
    print("SUMMARY", json.dumps(r))
    assert r["failed"] == 0 and r["tokens_equal"], r
    assert r["steps"]["stock"] == r["steps"]["elastic"] and r["steps"]["stock"], r
    assert r["preemptions"]["stock"] == r["preemptions"]["elastic"], r
    assert r["preemptions"]["stock"][0] > 0, r  # a wave the limit never preempts tests nothing


@needs_vllm
def test_cuda_graphs_elastic_equals_stock_tokens(model):
    res = _bench(model, "--repeats", "1", "--warmup", "0", "--graphs")
    r = res["summary"]
    print("SUMMARY", json.dumps(r))
    assert r["failed"] == 0 and r["tokens_equal"], r
    runs = {x["mode"]: x for x in res["runs"]}
    if "opstub_calls" in runs["elastic"]:  # the stand-in's weak_ref_tensor ran: graphs captured
        assert runs["elastic"]["opstub_calls"].get("_C.weak_ref_tensor", 0) > 0
    # capture wrote into the KV range without backing it: after start-up only the null block's
    # page and the reserve are mapped, as without graphs
    e = runs["elastic"]
    assert e["mapped_after_init"] <= (1 + e["reserve_pages"]) * e["page_id_bytes"], e
