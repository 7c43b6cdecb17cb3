"""SGLang's own mem_cache classes (0.5.23, or 0.5.16 in its own venv) against the elastic
allocator, on CPU tensors.

Runs ``scenario.py`` in fresh interpreters of the SGLang venv: once stock, once with
``WORKBENCH_KV_AUTOPATCH=1`` (the ``.pth`` file boots the patches, as in a real server start).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                                 reason="needs the SGLang venv (make test-engines)")]

HERE = Path(__file__).parent
SCENARIO = HERE / "scenario.py"


def _run(script: Path | str, extra_env: dict[str, str], *args: str, code: str | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_KV_")}
    env.update(extra_env)
    cmd = [sys.executable, "-c", code] if code else [sys.executable, str(script), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return proc


def _result(proc) -> dict:
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"no result (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="module")
def stock():
    return _result(_run(SCENARIO, {}))


@pytest.fixture(scope="module")
def elastic():
    return _result(_run(SCENARIO, {"WORKBENCH_KV_AUTOPATCH": "1",
                                   "WORKBENCH_KV_MAX_CACHED_TOKENS": "8",
                                   "WORKBENCH_KV_MIN_RESERVED_PAGES": "0",
                                   "WORKBENCH_KV_MAX_RESERVED_PAGES": "0"}))


def test_autopatch_applies_every_patch(stock, elastic):
    assert stock["patches"] == []  # off unless switched on
    status = {p["patch"]: p["status"] for p in elastic["patches"]}
    assert status == {"elastic-mha-pool": "applied", "elastic-mla-pool": "applied",
                      "elastic-token-allocator": "applied", "elastic-paged-allocator": "applied",
                      "radix-cache-bound": "applied", "kv-budget": "applied",
                      "leak-check-unheld": "applied", "admission-charge": "applied",
                      "decode-charge": "applied"}


@pytest.mark.parametrize("page_size", ["1", "16"])
def test_radix_cache_flow_matches_stock(stock, elastic, page_size):
    s, e = stock["flows"][page_size], elastic["flows"][page_size]
    assert e["class"].startswith("Elastic") and e["pool"] == "ElasticMHATokenToKVPool"
    same = ("k_shape", "available0", "readback", "insert_a", "hit_b", "insert_b",
            "tree_tokens", "evictable_locked", "evicted", "available_after")
    assert {k: e[k] for k in same} == {k: s[k] for k in same}
    # the cached-token bound (8) applies when a request is released; stock keeps everything
    assert s["evictable_after_release"] > 8 >= e["evictable_after_release"]


@pytest.mark.parametrize("page_size", ["1", "16"])
def test_pages_map_and_unmap_and_misses_are_none(elastic, page_size):
    f = elastic["elastic"][f"page_size_{page_size}"]
    page_id = 2 << 20 << 2  # 2 MiB x 2 layers x K,V
    assert f["mapped0"] == page_id  # only the padded slot's page
    assert f["mapped_up"] == 5 * page_id and f["rss_up_mib"] >= 31
    assert f["mapped_down"] == page_id and f["rss_down_mib"] <= 1
    assert f["alloc_miss"] is True
    if page_size == "16":
        assert f["alloc_extend_miss"] is True and f["alloc_extend_small"] == 16
        assert f["alloc_decode_miss"] is True


def test_mla_pool_is_elastic_with_stock_shapes(stock, elastic):
    s, e = stock["mla"], elastic["mla"]
    assert s["pool"] == "MLATokenToKVPool" and e["pool"] == "ElasticMLATokenToKVPool"
    assert e["shape"] == s["shape"] == [8193, 1, 576] and e["readback"] == s["readback"] == 2.5
    # 576 bf16 = 1152 B per slot per layer; slot 0's page id (2 MiB x 2 layers) is mapped
    assert e["layout"] == "contiguous" and e["mapped"] == e["page_id"] == 2 * (2 << 20)


@pytest.mark.parametrize("page_size", ["1", "16"])
def test_frees_in_a_free_group_land_at_its_end(elastic, page_size):
    f = elastic["free_group"][page_size]
    pages = 128 // int(page_size)  # two allocations of 64 slots
    assert (f["held"], f["in_group"], f["after_group"]) == (pages, pages, 0)
    if page_size == "16":
        assert f["decode"] == {"opens_page": True, "continues": True}


def test_the_plan_is_the_installed_versions(elastic):
    import sglang

    want = ">=0.5.16,<0.5.17" if sglang.__version__.startswith("0.5.16") else ">=0.5.23,<0.5.24"
    assert {p["versions"] for p in elastic["patches"]} == {want}


def test_leak_check_counts_unheld_slots_not_what_a_limit_lets_allocate(elastic):
    f = elastic["leak_check"]
    assert f["available"] < 8192 - 1000  # the limit holds admission below the unheld slots
    assert f == {"available": f["available"], "stock_leak": True, "patched_leak": False}


def test_a_kvctl_limit_reaches_an_idle_engine_through_its_pool_stats(elastic):
    assert elastic["kvctl_idle"] == {"kvctl_rc": 0, "limit_before_poll": False,
                                     "limit_after_poll": True, "outcome": "applied"}


def test_refuses_an_unsupported_version_naming_patch_version_and_fix():
    code = ("import dataclasses\n"
            "from workbench.adapters import boot\n"
            "plan = boot.plans()['sglang']\n"
            "plan.patches = [dataclasses.replace(p, versions='>=9.0') for p in plan.patches]\n"
            "import sglang.srt.mem_cache.memory_pool\n")
    proc = _run("", {"WORKBENCH_KV_AUTOPATCH": "1"}, code=code)
    assert proc.returncode != 0
    err = proc.stderr
    assert "AutopatchError" in err and "elastic-mha-pool" in err and "0.5.23" in err
    assert "Fix: install sglang==0.5.23" in err and "nothing was patched" in err
