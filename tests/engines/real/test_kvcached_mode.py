"""The kvcached mode without a GPU: its environment (kvcached's switches, none of the workbench's),
its segment reader, its log's map costs, the ballast arithmetic, kvcached's setting's KV budget,
and that an engine started over a stand-in server leaves neither segment nor socket folder."""

from __future__ import annotations

import struct
import sys
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.engines.real import kvcached as kvc
from workbench.engines.real.kvcached_budget import (
    A100_80G_TOTAL,
    GRANULE,
    LLAMA_8B_A100,
    kvcached_cap,
    setting_budget,
    static_share,
)
from workbench.engines.real.vllm import VllmSpec
from workbench.errors import ConfigError
from workbench.units import GiB

FAKE = [sys.executable, str(Path(__file__).parent / "fake_server.py")]


def test_the_environment_is_kvcacheds_own_and_names_one_segment():
    env = kvc.KvcachedSetting().env("kvc_a_1")
    assert env["ENABLE_KVCACHED"] == "true" and env["KVCACHED_AUTOPATCH"] == "1"
    assert env["KVCACHED_IPC_NAME"] == "kvc_a_1" and env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert (env["KVCACHED_GPU_UTILIZATION"], env["KVCACHED_MIN_RESERVED_PAGES"],
            env["KVCACHED_MAX_RESERVED_PAGES"]) == ("0.95", "5", "10")  # its bench-config
    assert "KVCACHED_CONTIGUOUS_LAYOUT" not in env  # kvcached's default layout
    assert kvc.KvcachedSetting(contiguous_layout=False).env("x")["KVCACHED_CONTIGUOUS_LAYOUT"] \
        == "false"
    assert not [k for k in env if k.startswith("WORKBENCH_")]


@pytest.mark.parametrize("bad", [dict(gpu_utilization=0.0), dict(gpu_utilization=1.5),
                                 dict(min_reserved_pages=6, max_reserved_pages=5),
                                 dict(min_reserved_pages=-1)])
def test_bad_settings_are_refused_in_one_line(bad):
    with pytest.raises(ConfigError, match="Fix:"):
        kvc.KvcachedSetting(**bad)


@pytest.mark.parametrize("name", ["", "a/b", "x" * 65, "a b"])
def test_a_name_kvcached_would_rewrite_is_refused(name):
    with pytest.raises(ConfigError, match="Fix:"):
        kvc.check_name(name)


@given(st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True))
def test_the_socket_folder_is_the_names_own(name):
    d = kvc.socket_dir(name)
    assert d == kvc.socket_dir(name) and d.parent == kvc.SOCKET_ROOT
    assert d.name == f"kvcached-tp-{name}-{uuid.uuid5(uuid.NAMESPACE_DNS, name).hex[:8]}"
    assert len(str(d / "w0.sock")) <= 108  # a Unix socket path's limit


def test_the_segment_reads_limit_used_and_prealloc(tmp_path):
    (tmp_path / "seg").write_bytes(struct.pack("=qqq", 24 * GiB, 3 << 27, 5 << 27))
    s = kvc.read_segment("seg", tmp_path)
    assert (s.limit, s.used, s.prealloc, s.mapped) == (24 * GiB, 3 << 27, 5 << 27, 8 << 27)
    assert kvc.read_segment("gone", tmp_path) is None
    (tmp_path / "short").write_bytes(b"\0" * 8)
    assert kvc.read_segment("short", tmp_path) is None


def test_map_costs_come_from_kvcacheds_info_lines():
    head = "[KVCACHED_MEMORY_POOL][INFO][12:00:00]csrc/page_allocator.cpp:741 [p:1 t:2]"
    log = "\n".join([f"{head}prealloc cost: 4000 us, prealloc 5 pages.",
                     f"{head}prealloc cost: 10 us, prealloc 0 pages.",
                     f"{head}Unmapped 2 pages from KV tensors, cost: 300 us",
                     "INFO vllm: unrelated line"])
    assert kvc.map_costs(log) == {"grow": [800.0], "shrink": [150.0]}


@given(st.integers(0, 200 * GiB), st.integers(1, 200 * GiB), st.integers(0, 100 * GiB),
       st.floats(0.5, 1.0))
def test_the_ballast_leaves_the_budget_to_kvcacheds_headroom_rule(free, budget, mapped, u):
    total = 200 * GiB
    b = kvc.ballast_bytes(free, total, budget, mapped, u)
    # after holding b, kvcached may still map free - b - headroom = what the budget lacks
    assert free - b - int(total * (1 - u)) == budget - mapped


def test_the_engine_runs_kvcached_and_not_the_workbench(tmp_path, monkeypatch):
    monkeypatch.setenv(kvc.PYTHON_VAR, sys.executable)
    monkeypatch.setenv("WORKBENCH_KV_GPU_BUDGET", "123")
    e = kvc.engine("k0", "model", tmp_path, env={"WORKBENCH_KV_STEP_LOG": "x", "A": "1"},
                   num_gpu_blocks=100, kv_cache_bytes=200 << 20, server_cmd=FAKE)
    try:
        env = e.env()
        assert e.spec.python == sys.executable and not e.spec.elastic and e.ipc_name == ""
        assert env["ENABLE_KVCACHED"] == "true" and env["KVCACHED_IPC_NAME"] == e.kvcached_ipc
        assert env["A"] == "1" and not [k for k in env if k.startswith("WORKBENCH_KV_")]
        assert "--num-gpu-blocks-override" in e.spec.args(1, "k0")
    finally:
        e.close()


def test_without_kvcacheds_interpreter_the_mode_refuses(tmp_path, monkeypatch):
    monkeypatch.delenv(kvc.PYTHON_VAR, raising=False)
    with pytest.raises(ConfigError, match="gpu/kvcached/env.sh"):
        kvc.engine("k0", "model", tmp_path)
    with pytest.raises(ConfigError, match="kvcached.engine"):
        kvc.KvcachedVllmEngine("k1", VllmSpec(model="m", elastic=True))


def test_its_segment_is_sampled_and_nothing_is_left_after_close(tmp_path, monkeypatch):
    monkeypatch.setenv(kvc.PYTHON_VAR, sys.executable)
    monkeypatch.setattr(kvc, "SHM_DIR", tmp_path)
    monkeypatch.setattr(kvc, "SOCKET_ROOT", tmp_path)
    with kvc.engine("k2", "model", tmp_path, server_cmd=FAKE, startup_timeout_s=60) as e:
        seg = tmp_path / e.kvcached_ipc
        seg.write_bytes(struct.pack("=qqq", 1 << 30, 2 << 20, 3 << 20))  # as kvcached writes
        kvc.socket_dir(e.kvcached_ipc).mkdir()
        deadline = time.monotonic() + 10
        while not e.memory_timeline() and time.monotonic() < deadline:
            time.sleep(0.05)
        s = e.memory_timeline()[-1]
        assert (s.instance, s.mapped_bytes, s.reserved_bytes) == ("k2", 5 << 20, 3 << 20)
        assert e.facts()["mapped_idle"] == 5 << 20 and e.facts()["limit"] == 1 << 30
        assert e.facts()["patches"]["missing"] == list(kvc.ESSENTIAL)  # a stand-in: no kvcached
    assert not seg.exists() and not kvc.socket_dir(e.kvcached_ipc).exists()


def test_the_patch_report_names_what_kvcached_left_unpatched():
    log = ("[kvcached][INFO][x][patch_base.py:178] Successfully patched vllm: elastic_block_pool,"
           " engine_core, gpu_worker\n"
           "[kvcached][WARNING][x][patch_base.py:180] Failed to patch vllm: gpu_model_runner,"
           " nixl_connector_compat\n"
           "[kvcached][INFO][x][patch_base.py:178] Successfully patched vllm: kv_cache_coordinator,"
           " gpu_model_runner\n")
    r = kvc.patch_report(log)
    assert r["failed"] == ["nixl_connector_compat"] and "gpu_model_runner" in r["applied"]
    assert r["missing"] == ["allocate_slots"]


def test_kvcacheds_a100_run_leaves_about_25_gib_beside_three_weight_sets():
    b = setting_budget()
    share = int(A100_80G_TOTAL * 0.31) - LLAMA_8B_A100.profiled
    assert b.total_bytes == 3 * share // GRANULE * GRANULE and b.static_bytes == b.total_bytes // 3
    assert 23 * GiB < b.total_bytes < 26 * GiB  # both routes land near 24 GiB
    assert abs(b.kvcached_cap_bytes - b.total_bytes) < 2 * GiB


@given(st.integers(60, 200).map(lambda g: g * GiB), st.integers(1, 3))
def test_the_arithmetic_grows_with_the_card_and_shrinks_with_engines(total, n):
    assert static_share(total + GiB, LLAMA_8B_A100) > static_share(total, LLAMA_8B_A100)
    assert kvcached_cap(total, LLAMA_8B_A100, n) - kvcached_cap(total, LLAMA_8B_A100, n + 1) \
        == LLAMA_8B_A100.resident


def test_a_card_too_small_for_the_setting_is_refused():
    with pytest.raises(ConfigError, match="Fix:"):
        setting_budget(40 * GiB)


class _Held:
    def __init__(self):
        self.n = 0

    def hold(self, n):
        self.n = max(0, n)
        return self.n


class _Up:
    def __init__(self, mapped):
        self.mapped = mapped

    def segment(self):
        return kvc.Segment(0, self.mapped, 0)


@pytest.mark.parametrize("free,budget", [(60 * GiB, 20 * GiB), (10 * GiB, 20 * GiB)])
def test_the_cap_holds_the_rest_or_says_what_is_missing(free, budget):
    total, held = 80 * GiB, _Held()
    state = {"free": free}

    def mem_info():
        return state["free"] - held.n, total

    r = kvc.cap_at_budget([_Up(GiB), _Up(GiB)], budget, held, mem_info)
    left = r["free_after"] - int(total * 0.05) + r["mapped_at_start"]
    if r["wanted"] >= 0:
        assert r["held"] == r["wanted"] and left == budget and r["kvcached_may_map"] == budget
    else:
        assert r["held"] == 0 and r["kvcached_may_map"] == budget + r["wanted"] == left
