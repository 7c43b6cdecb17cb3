"""vLLM 0.34's real classes with the 0.34 plan, on the host device (``make test-engine-vllm034``).

The CUDA build of ``vllm==0.34.0`` in ``.venvs/vllm034``: its block pool, KV cache manager,
extensible KV cache and worker sizing import and run on this CPU-only host; generation does not
(the wheel ships no CPU attention ops). Every test runs in a fresh interpreter of the venv, with
``WORKBENCH_KV_AUTOPATCH=1`` (the ``.pth`` patches vLLM as it imports) unless it shows stock.
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


def _version() -> str:
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return ""


VERSION = _version()
pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None
                                 or not VERSION.startswith("0.34."),
                                 reason="needs the vLLM 0.34 venv (make test-engine-vllm034)")]
HERE = Path(__file__).parent
ROOT = HERE.parents[2]
VLLM_TESTS = Path(os.environ.get("WORKBENCH_VLLM_SRC", ROOT / f".venvs/src/vllm-{VERSION}"))
# the card of the two-engine test: 64 MiB of host memory under one budget, no reserve pages
# parked (so mapped bytes are held blocks only), nothing kept free below the budget
CARD = dict(WORKBENCH_KV_GPU_BUDGET="64MiB", WORKBENCH_KV_MIN_RESERVED_PAGES="0",
            WORKBENCH_KV_MAX_RESERVED_PAGES="0", WORKBENCH_KV_GPU_UTILIZATION="1")
MiB = 1 << 20


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_KV_")}
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


def _python(args: list[str], timeout: int = 300, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=_env(**extra), capture_output=True,
                          text=True, timeout=timeout)


def _result(proc: subprocess.CompletedProcess) -> dict:
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"no result (rc {proc.returncode}):\n{proc.stderr[-4000:]}")


APPLIED = ["elastic-block-pool:applied", "allocate-slots-miss:applied",
           "elastic-kv-cache:applied", "kv-sizing:applied", "idle-tidy:applied",
           "step-refill:applied"]


def test_the_plan_applies_to_the_real_classes():
    code = ("import json\n"
            "import vllm.v1.core.block_pool as bp, vllm.v1.core.kv_cache_manager as km\n"
            "import vllm.v1.worker.extensible_kv_cache as ekc, vllm.v1.worker.gpu_worker as gw\n"
            "from workbench.adapters import boot\n"
            "print('RESULT ' + json.dumps({'records': [f'{r.patch}:{r.status}' for r in "
            "boot.plans()['vllm'].records], 'pool': bp.BlockPool.__name__, "
            "'tensor': ekc.ExtensibleTensor.__name__, "
            "'measure': gw.measure_kv_cache_blocks.__module__}))\n")
    stock = _result(_python(["-c", code.replace("boot.plans()['vllm'].records", "[]")]))
    ours = _result(_python(["-c", code], WORKBENCH_KV_AUTOPATCH="1"))
    assert stock == {"records": [], "pool": "BlockPool", "tensor": "ExtensibleTensor",
                     "measure": "vllm.v1.worker.extensible_kv_cache"}
    assert ours == {"records": APPLIED, "pool": "ElasticBlockPool", "tensor": "ElasticTensor",
                    "measure": "workbench.adapters.vllm.extensible"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, dict]:
    shm = str(tmp_path_factory.mktemp("shm"))  # this test's own budget segment
    return {mode: _result(_python([str(HERE / "engines_pair.py"), mode], WORKBENCH_KV_AUTOPATCH="1",
                                  WORKBENCH_KV_SHM_DIR=shm, **CARD))
            for mode in ("elastic", "stock")}


def test_the_allocation_hook_backs_the_cache_with_the_ledger_at_one_base(pair):
    r = pair["elastic"]
    assert r["patches"] == APPLIED
    assert r["views"] == {"written_block_landed": True, "unheld_block_reads_zero": True,
                          "same_base": True}
    # vLLM's defaults: the capacity is the whole card; only the null block's page is mapped
    assert r["a_start"] == {"blocks": 4096, "capacity_blocks": 4096, "mapped_bytes": 4 * MiB,
                            "pool": "ElasticBlockPool"}


def test_with_the_budget_the_second_engine_gets_memory_and_the_budget_decides(pair):
    r = pair["elastic"]
    assert r["b_start"]["blocks"] == 4096 and r["b_start"]["pool"] == "ElasticBlockPool"
    assert r["a_took"] and r["b_took"]
    assert r["mapped_a_b"] == [20 * MiB, 20 * MiB]  # each maps what its blocks need
    assert r["a_burst"] is False  # past the card's 64 MiB: refused, a miss, not a crash
    assert r["a_burst_after_b_freed"] is True  # B gave its pages back; A maps them
    assert r["mapped_after"][1] == 4 * MiB and sum(r["mapped_after"]) <= r["card_bytes"]


def test_without_it_the_first_engines_commit_leaves_the_second_none(pair):
    r = pair["stock"]
    # vLLM's own post-warm-up sizing: A measures the free card once and commits it
    assert r["a_start"]["blocks"] == 3840 and r["a_start"]["mapped_bytes"] == 60 * MiB
    assert r["card_free_after_a_start"] == 4 * MiB  # the margin vLLM keeps, nothing more
    assert r["b_start"]["blocks"] == 0 and r["b_start"]["pool"] is None


def test_a_memory_limit_miss_is_vllms_none():
    script = [str(HERE.parent / "vllm" / "kv_manager_limit.py")]
    stock = _result(_python(script))
    limited = _result(_python(script, WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_VLLM_STANDALONE="1",
                              WORKBENCH_KV_MEMORY_LIMIT="4MiB"))
    assert stock["pool"] == "BlockPool" and stock["b_admitted"] is True
    assert limited["pool"] == "ElasticBlockPool" and limited["budget_pages"] == 2
    assert limited["a_admitted"] and not limited["b_admitted"]  # allocate_slots: None
    assert limited["b_after_free_admitted"]


def test_a_moved_seam_is_refused_in_one_line_naming_it():
    # 0.34's free_blocks as an older release had it (no evict_first), before the plan applies
    code = ("import vllm.v1.core.block_pool as bp\n"
            "def free_blocks(self, ordered_blocks): pass\n"
            "bp.BlockPool.free_blocks = free_blocks\n"
            "from workbench.adapters.vllm import plans\n"
            "plan = plans.build_plan()\n"
            "try:\n"
            "    plan.apply_all()\n"
            "except Exception as err:\n"
            "    print('REFUSED ' + str(err))\n"
            "print('POOL ' + bp.BlockPool.__name__)\n")
    proc = _python(["-c", code])
    refused = [ln for ln in proc.stdout.splitlines() if ln.startswith("REFUSED ")]
    assert len(refused) == 1, proc.stdout + proc.stderr[-2000:]
    line = refused[0]
    assert "patch 'elastic-block-pool'" in line and "has no parameter evict_first" in line
    assert "nothing was patched" in line and f"vllm {VERSION}" in line
    assert "POOL BlockPool" in proc.stdout  # nothing patched


def test_doctor_check_accepts_034_and_refuses_an_unknown_version_in_one_line():
    doctor = [sys.executable, "-m", "workbench", "doctor", "--check"]
    ok = subprocess.run(doctor, env=_env(WORKBENCH_KV_AUTOPATCH="1"), capture_output=True,
                        text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-2000:]
    assert re.search(r"would apply +elastic-kv-cache", ok.stdout)
    assert "check: applied" in ok.stdout
    code = ("import sys, workbench.adapters.versions as v\n"
            "real = v.dist_version\n"
            "v.dist_version = lambda *d: ('vllm', '0.35.0') if 'vllm' in d else real(*d)\n"
            "from workbench.cli import main\n"
            "sys.argv = ['workbench', 'doctor', '--check']\n"
            "main()\n")
    bad = _python(["-c", code])  # no autopatch: no 0.34 plan registered at start-up
    assert bad.returncode == 1
    lines = [ln for ln in bad.stdout.splitlines() if "no plan for vllm 0.35.0" in ln]
    refusal = [ln for ln in lines if ln.startswith("workbench autopatch refused")]
    assert len(refusal) == 1 and ". Fix: install vllm==0.26.0 or" in refusal[0], bad.stdout


def _vllm_suite(**extra: str) -> tuple[dict[str, int], str]:
    files = ["tests/v1/core/test_prefix_caching.py",
             "tests/v1/core/test_single_type_kv_cache_manager.py"]
    env = _env(PYTHONPATH=str(HERE.parent / "vllm"), **extra)
    proc = subprocess.run([sys.executable, "-m", "pytest", *files, "--noconftest", "-q",
                           "-p", "no:cacheprovider", "-o", "addopts=", "-p",
                           "substitution_probe", "-rf"], cwd=VLLM_TESTS, env=env,
                          capture_output=True, text=True, timeout=600)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|error)", proc.stdout)}
    return counts, proc.stdout


@pytest.mark.skipif(not (VLLM_TESTS / "tests/v1/core/test_prefix_caching.py").exists(),
                    reason=f"vLLM {VERSION} test sources missing (make engine-vllm034 "
                           "fetches them)")
def test_vllms_own_prefix_caching_tests_pass_with_the_elastic_pool():
    stock, stock_out = _vllm_suite()
    ours, ours_out = _vllm_suite(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_VLLM_STANDALONE="1",
                                 WORKBENCH_KV_VLLM_BLOCKS_PER_PAGE="4")
    built = int(re.search(r"WORKBENCH_ELASTIC_POOLS=(\d+)", ours_out).group(1))
    assert built >= 100  # every manager in the suite was built on the elastic pool
    failed = sorted(set(re.findall(r"^FAILED (\S+)", ours_out, re.M)))
    stock_failed = sorted(set(re.findall(r"^FAILED (\S+)", stock_out, re.M)))
    assert failed == stock_failed, "the elastic pool fails tests the stock pool passes"
    assert ours.get("passed", 0) == stock.get("passed", 0) >= 200


class Proc:
    """An ``engine_proc.py`` process: one engine's KV cache, one command a line."""

    def __init__(self, name: str, env: dict[str, str]):
        self.p = subprocess.Popen([sys.executable, str(HERE / "engine_proc.py"), name],
                                  env=_env(PYTHONPATH=str(HERE), **env), text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL)

    def answer(self) -> dict:
        for line in self.p.stdout:
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        raise AssertionError(f"{self.p.args[-1]} ended (rc {self.p.wait()})")

    def ask(self, cmd: str) -> dict:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.answer()

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait(timeout=60)


def test_two_engine_processes_share_the_card_through_the_budget(tmp_path):
    env = dict(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_SHM_DIR=str(tmp_path), **CARD)
    a, b = Proc("A", env), Proc("B", env)
    try:
        starts = [a.answer(), b.answer()]  # both start with vLLM's defaults: the whole card
        assert [s["blocks"] for s in starts] == [4096, 4096]
        assert [s["mapped_bytes"] for s in starts] == [4 * MiB, 4 * MiB]
        assert a.ask("take 1024")["took"] and b.ask("take 1024")["took"]
        burst = a.ask("take 2048")
        assert burst["took"] is False and burst["card_free"] < 32 * MiB  # B holds the rest
        assert b.ask("free")["mapped_bytes"] == 4 * MiB  # B's pages went back to the card
        again = a.ask("take 2048")
        assert again["took"] is True and again["mapped_bytes"] == 52 * MiB
        assert a.ask("state")["card_free"] == 64 * MiB - 52 * MiB - 4 * MiB
    finally:
        a.close()
        b.close()
