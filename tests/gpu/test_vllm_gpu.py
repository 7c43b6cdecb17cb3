"""vLLM 0.26 with elastic KV on a CUDA GPU (``make test-gpu``; the H200 recipe is
``gpu/vllm26``): the adapter's ledger on CUDA virtual memory, then the real engine, stock and with
``WORKBENCH_KV_AUTOPATCH=1``, in fresh processes (``tests/engines_real/vllm/gpu_generate.py``).

Skipped with one line where there is no CUDA GPU, no cuda-python, or no vLLM 0.26.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench import backends
from workbench.units import MiB

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests/engines_real/vllm/gpu_generate.py"

_ok, _why = backends.probe("cuda:0")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _ok, reason=f"no usable CUDA GPU here: {_why}")]


def _vllm_026() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (gpu/vllm26/prepare.sh + run.sh bring 0.26.0)"
    from workbench.adapters.versions import dist_version

    found = dist_version("vllm")
    if found is None or not found[1].startswith("0.26."):
        return f"needs vLLM 0.26 (found {found})"
    return None


needs_vllm = pytest.mark.skipif(_vllm_026() is not None, reason=str(_vllm_026()))


# -- the ledger on CUDA: fences and the writable unbacked range ---------------------------------
def _ledger(**cfg):
    from workbench.adapters.vllm.fences import fence_factory
    from workbench.adapters.vllm.ledger import BlockLedger
    from workbench.backends import shared_device
    from workbench.config import PoolConfig
    from workbench.core.geometry import KVGeometry, Layout

    dev = shared_device("cuda:0")
    geo = KVGeometry(num_layers=2, kv_heads=1, head_dim=64 * 1024, block_size=1, num_blocks=256,
                     num_buffers=1, dtype_bytes=2, page_size=2 * MiB, layout=Layout.CONTIGUOUS)
    kv = BlockLedger(geo, dev, name="gpu-test", config=PoolConfig(**cfg),
                     defer_release=True)
    kv.fence = fence_factory(dev)
    return kv, dev


def test_a_page_is_unmapped_only_after_the_kernels_queued_before_its_release():
    import torch

    from workbench.core.events import PageState

    kv, dev = _ledger(min_reserved_pages=0, max_reserved_pages=0)
    flat = dev.tensor(kv.space.base, kv.space.size, torch.bfloat16)
    kv.hold([20])  # page 1 (16 blocks of 128 KiB per 2 MiB page)
    block = flat[20 * 65536 * 2:20 * 65536 * 2 + 65536]  # layer 0 of block 20 (contiguous)
    torch.cuda._sleep(1)  # load both kernels first: a lazy module load may synchronize
    block.fill_(0.0)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s ahead of the write, as a running step would be
    block.fill_(3.0)
    kv.release([20])
    assert kv.pages.state[1] is PageState.RETIRED and kv.space.is_mapped(1)
    assert not kv._fences[0][1].query()  # the kernels have not finished
    kv.reap()
    assert kv.pages.state[1] is PageState.RETIRED  # still: nothing unmapped under a kernel
    torch.cuda.synchronize()
    assert kv.reap() == 1 and not kv.space.is_mapped(1)
    kv.close()


def test_writes_to_unbacked_blocks_do_not_fault_and_the_null_block_stays_mapped():
    import torch

    kv, dev = _ledger(min_reserved_pages=0, max_reserved_pages=0)
    assert dev.zero_access == "readwrite" and kv.space.is_mapped(0)
    flat = dev.tensor(kv.space.base, kv.space.size, torch.bfloat16)
    flat[200 * 65536 * 2:][:65536].fill_(7.0)  # block 200: page 12, never backed
    torch.cuda.synchronize()  # a fault would surface here
    flat[:65536].fill_(1.0)  # the null block (graph capture's dummy slots land there)
    assert float(flat[:65536].sum()) == 65536.0
    kv.close()


# -- the real engine -------------------------------------------------------------------------
def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKBENCH_KV_", "GEN_"))}
    env.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0",
                **extra})  # extra may name the runner (V2's fixtures)
    return env


def _result(proc: subprocess.CompletedProcess) -> dict:
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"no result (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-6000:]}")


def _run(model: str, timeout: int = 240, **extra: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), model], env=_env(**extra),
                          capture_output=True, text=True, timeout=timeout)
    return _result(proc)


def _elastic(name: str, **extra: str) -> dict[str, str]:
    return dict(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_IPC_NAME=name, **extra)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    spec = importlib.util.spec_from_file_location("tinyllama",
                                                  ROOT / "tests/engines_real/tinyllama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.build(tmp_path_factory.mktemp("tiny") / "tiny-llama"))


# vLLM 0.26's plan: both runners' KV seams, the check that the chosen one's took, the budget
PATCHES = ["elastic-block-pool:applied", "allocate-slots-miss:applied",
           "elastic-kv-tensors:applied", "elastic-kv-tensors-v2:applied",
           "kv-runner-check:applied", "virtual-budget:applied", "idle-tidy:applied",
           "step-refill:applied"]


@pytest.fixture(scope="module")
def stock(model):
    return _run(model)


@pytest.fixture(scope="module")
def elastic(model):
    # no prefix cache kept past its request and a small reserve, so mapped bytes follow load
    return _run(model, **_elastic("vllm_gpu_a", WORKBENCH_KV_MAX_CACHED_TOKENS="0",
                                  WORKBENCH_KV_MIN_RESERVED_PAGES="1",
                                  WORKBENCH_KV_MAX_RESERVED_PAGES="2"))


@needs_vllm
def test_elastic_vllm_generates_the_same_greedy_tokens_as_stock(stock, elastic):
    print("STOCK", json.dumps({k: v for k, v in stock.items() if k != "token_ids"}))
    print("ELASTIC", json.dumps({k: v for k, v in elastic.items() if k != "token_ids"}))
    assert stock["patches"] == []
    assert elastic["patches"] == PATCHES
    assert stock["runner"] == elastic["runner"] == elastic["workbench_runner"] == "v1"
    assert stock["finished"] == elastic["finished"] == len(stock["token_ids"])
    assert elastic["token_ids"] == stock["token_ids"]
    assert elastic["kv_shape"][1:] == stock["kv_shape"][1:]  # vLLM's shape (own block count)
    # the op stand-in answered two capability queries and computed nothing
    queries = {"_C.cutlass_scaled_mm_supports_fp8", "_C.cutlass_scaled_mm_supports_block_fp8"}
    assert set(elastic["opstub_calls"]) <= queries and set(stock["opstub_calls"]) <= queries


@needs_vllm
def test_kv_tensors_are_views_of_the_vmm_pool_and_mapped_bytes_follow_load(elastic):
    assert elastic["views_in_pool"] and elastic["layout"] == "contiguous"
    pools = [p for p in elastic["kvctl_list"] if isinstance(p, dict)]
    assert any(p.get("name") == "vllm_gpu_a" for p in pools), elastic["kvctl_list"]
    page = elastic["page_id_bytes"]
    assert elastic["mapped_idle"] == 2 * page  # the null block's page and one reserved
    assert elastic["mapped_peak"] >= 4 * page  # grew with the batch
    # and gave them back once the last step's kernels finished (retired pages wait for that)
    assert elastic["mapped_settled"] <= 3 * page < elastic["mapped_peak"]
    assert elastic["maps"] >= 3 and elastic["unmaps"] >= 1
    b = elastic["budget"]
    assert b["kv"] == b["budget"] - b["weights"] - b["activation_peak"] > 0


@needs_vllm
def test_a_kvctl_limit_from_another_process_shrinks_the_pool_mid_run(model, elastic):
    page = elastic["page_id_bytes"]
    # a small budget keeps vLLM's free queue short: under a limit the pool walks it per step
    r = _run(model, **_elastic("vllm_gpu_lim", GEN_LIMIT_AT=str(3 * page),
                               GEN_LIMIT=str(2 * page), WORKBENCH_KV_VLLM_BUDGET="2GiB"))
    print("LIMIT", json.dumps({k: v for k, v in r.items() if k != "token_ids"}))
    assert r["kvctl"]["rc"] == 0, r["kvctl"]
    assert r["kvctl"]["mapped_at"] >= 3 * page  # it came mid-run, above the new limit
    assert r["finished"] == len(r["token_ids"]) == len(elastic["token_ids"])  # none failed
    assert all(len(t) == len(elastic["token_ids"][0]) for t in r["token_ids"])
    assert r["limit_bytes"] == 2 * page and r["limit_state"] == "applied"
    assert r["mapped_after"] <= 2 * page


@needs_vllm
def test_an_idle_engine_core_releases_retired_pages_and_refills_with_no_step(model):
    """vLLM's default layout, the engine core in a process of its own: after the batch no step
    runs, so only the idle loop's tidy-up (the ``idle-tidy`` patch) releases what its last frees
    retired; the pool's control segment shows it from this process."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests/engines_real/vllm/gpu_idle.py"), model],
        env=_env(VLLM_ENABLE_V1_MULTIPROCESSING="1", **_elastic(
            "vllm_gpu_idle", WORKBENCH_KV_MIN_RESERVED_PAGES="1",
            WORKBENCH_KV_MAX_RESERVED_PAGES="2")),
        capture_output=True, text=True, timeout=240)
    r = _result(proc)
    print("IDLE", json.dumps(r))
    page, s = r["settled"]["page_id_bytes"], r["settled"]
    assert r["finished"] == 48
    assert s["mapped"] == s["used"] + s["reserved"]  # no page left retired
    assert s["used"] == page and s["reserved"] == 2 * page  # the null block's page, the reserve
    assert r["waited_s"] < 5.0


# -- Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1) ----------------------------------------------
V2 = {"VLLM_USE_V2_MODEL_RUNNER": "1"}


@pytest.fixture(scope="module")
def stock_v2(model):
    return _run(model, **V2)


@pytest.fixture(scope="module")
def elastic_v2(model):
    return _run(model, **V2, **_elastic("vllm_gpu_v2", WORKBENCH_KV_MAX_CACHED_TOKENS="0",
                                        WORKBENCH_KV_MIN_RESERVED_PAGES="1",
                                        WORKBENCH_KV_MAX_RESERVED_PAGES="2"))


@needs_vllm
def test_mrv2_elastic_generates_the_same_greedy_tokens_as_mrv2_stock(stock, stock_v2,
                                                                      elastic_v2):
    print("STOCK_V2", json.dumps({k: v for k, v in stock_v2.items() if k != "token_ids"}))
    print("ELASTIC_V2", json.dumps({k: v for k, v in elastic_v2.items() if k != "token_ids"}))
    assert stock_v2["patches"] == [] and elastic_v2["patches"] == PATCHES
    assert stock_v2["runner_class"] == elastic_v2["runner_class"] \
        == "vllm.v1.worker.gpu.model_runner.GPUModelRunner"
    assert stock_v2["runner"] == elastic_v2["runner"] == elastic_v2["workbench_runner"] == "v2"
    assert stock_v2["finished"] == elastic_v2["finished"] == len(stock_v2["token_ids"])
    assert elastic_v2["token_ids"] == stock_v2["token_ids"]
    assert elastic_v2["kv_shape"][1:] == stock_v2["kv_shape"][1:]
    # not asserted, printed: whether V2 and V1 give the same greedy tokens (other kernels)
    print("V2 == V1 (stock):", stock_v2["token_ids"] == stock["token_ids"])


@needs_vllm
def test_mrv2_kv_tensors_are_views_of_the_vmm_pool_and_mapped_bytes_follow_load(elastic_v2):
    assert elastic_v2["views_in_pool"] and elastic_v2["layout"] == "contiguous"
    page = elastic_v2["page_id_bytes"]
    assert elastic_v2["mapped_idle"] == 2 * page  # the null block's page and one reserved
    assert elastic_v2["mapped_peak"] >= 4 * page
    assert elastic_v2["mapped_settled"] <= 3 * page < elastic_v2["mapped_peak"]
    assert elastic_v2["maps"] >= 3 and elastic_v2["unmaps"] >= 1


@needs_vllm
def test_the_0_26_plans_seams_resolve_against_the_real_modules():
    """Every patch's check passes against vLLM 0.26's own modules (both runners' included)."""
    import importlib

    from workbench.adapters.vllm import plan26

    for p in plan26.build_plan().patches:
        assert p.check(importlib.import_module(p.module)) is None, p.name


def _pair(model: str, tmp: Path, elastic_kv: bool) -> list[subprocess.CompletedProcess]:
    """Two engines at 0.55 of the GPU each; stock starts the second once the first has sized
    its cache, elastic starts both at once. Both generate together once both are ready."""
    go = tmp / ("go-elastic" if elastic_kv else "go-stock")
    procs: list[subprocess.Popen] = []

    def ready(n: int) -> bool:
        deadline = time.time() + 200
        while time.time() < deadline and all(p.poll() is None for p in procs):
            if len(list(tmp.glob(go.name + ".ready.*"))) >= n:
                return True
            time.sleep(0.2)
        return False

    for name in ("vllm_gpu_p", "vllm_gpu_q"):
        extra = dict(GEN_UTIL="0.55", GEN_GO_FILE=str(go))
        if elastic_kv:
            extra.update(_elastic(name))
        elif procs:
            ready(1)
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), model], env=_env(**extra),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    ready(2)
    go.write_text("go")
    done = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


@needs_vllm
def test_two_elastic_engines_in_two_processes_share_the_gpu(model, stock, tmp_path):
    a, b = (_result(p) for p in _pair(model, tmp_path, elastic_kv=True))
    for r in (a, b):
        print("PAIR", json.dumps({k: v for k, v in r.items() if k != "token_ids"}))
        assert r["finished"] == len(stock["token_ids"]) and r["token_ids"] == stock["token_ids"]
    names = {p["name"] for p in b["kvctl_list"] + a["kvctl_list"] if isinstance(p, dict)}
    assert {"vllm_gpu_p", "vllm_gpu_q"} <= names


@needs_vllm
def test_stock_vllm_refuses_the_second_engine_at_the_same_utilization(model, tmp_path):
    first, second = _pair(model, tmp_path, elastic_kv=False)
    assert second.returncode != 0 and "less than desired GPU memory utilization" in \
        second.stderr, second.stderr[-2000:]


@needs_vllm
@pytest.mark.parametrize("runner", ["0", "1"], ids=["v1", "v2"])
def test_a_busy_engine_refills_its_reserve_inside_its_steps_not_in_its_allocations(model,
                                                                                   runner):
    """A decode that outgrows the reserve drains it step after step; with ``step-refill`` every
    refill after the first step runs in the window between the worker launching the forward
    pass and waiting for its tokens, none inside an allocation (both model runners)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests/engines_real/vllm/gpu_step.py"), model],
        env=_env(VLLM_USE_V2_MODEL_RUNNER=runner, **_elastic(
            f"vllm_gpu_step{runner}", WORKBENCH_KV_MIN_RESERVED_PAGES="1",
            WORKBENCH_KV_MAX_RESERVED_PAGES="2")),
        capture_output=True, text=True, timeout=240)
    r = _result(proc)
    print("STEP", runner, json.dumps(r))
    assert "step-refill:applied" in r["patches"] and r["finished"] == 32
    assert r["steps_seen"] > 100 and r["min_reserved"] == 1
    assert r["refills_in_steps"] > 0 and r["refills_inline_after_first_step"] == 0
