"""SGLang 0.5.23's own KV pool, allocators and radix cache with autopatch on a CUDA GPU.

Each SGLang process is fresh: stock (no switch) and elastic (``WORKBENCH_KV_AUTOPATCH=1``, booted
the way the ``.pth`` line boots it). Checks: the same flow results as stock, K/V written through
``set_kv_buffer`` read back exactly, pages map and unmap by the device's free memory, misses are
``None``, an unbacked write does not fault, a page freed under a running kernel is unmapped only
after it, a ``kvctl limit`` from another process is deferred then applied, and two pools in two
processes share the GPU. Where SGLang's kernels are absent (a bare GPU box) the import-only
stand-in in ``tests/engines_real/sglang/shim`` is put on the path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.units import MiB

ROOT = Path(__file__).resolve().parents[2]
SGL = ROOT / "tests" / "engines_real" / "sglang"
BOOT = ("import runpy, sys; from workbench.adapters import boot; boot.install(); "
        "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
ELASTIC = {"WORKBENCH_KV_AUTOPATCH": "1", "WORKBENCH_KV_MIN_RESERVED_PAGES": "0",
           "WORKBENCH_KV_MAX_RESERVED_PAGES": "0"}


def _why_skip() -> str | None:
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed (tests/engines_real/sglang/gpu_box.sh installs it)"
    torch = importlib.util.find_spec("torch") and __import__("torch")
    if not torch or not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    if importlib.util.find_spec("cuda.bindings") is None:
        return "cuda-python is not installed"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_why_skip() is not None,
                                                   reason=_why_skip() or "")]


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_KV_")}
    paths = [str(ROOT)]
    if importlib.util.find_spec("sgl_kernel") is None:
        paths.append(str(SGL / "shim"))
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", **extra)
    return env


def _popen(script: Path, extra: dict[str, str], **kw) -> subprocess.Popen:
    boot = extra.get("WORKBENCH_KV_AUTOPATCH") == "1"
    cmd = [sys.executable, "-c", BOOT, str(script)] if boot else [sys.executable, str(script)]
    return subprocess.Popen(cmd, env=_env(extra), cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            **kw)


def _record(name: str, data) -> None:
    """Keep the figures for a report when ``WORKBENCH_TEST_RESULTS`` names a folder."""
    folder = os.environ.get("WORKBENCH_TEST_RESULTS")
    if folder:
        Path(folder, f"{name}.json").write_text(json.dumps(data, indent=1))


def _result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=400)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"no RESULT line (exit {proc.returncode}); stderr is above")


@pytest.fixture(scope="module")
def runs():
    """The stock and the elastic scenario, run side by side."""
    stock = _popen(SGL / "gpu_scenario.py", {})
    elastic = _popen(SGL / "gpu_scenario.py", ELASTIC)
    out = _result(stock), _result(elastic)
    _record("sglang_gpu_scenario", {"stock": out[0], "elastic": out[1]})
    return out


def test_autopatch_applies_every_required_patch(runs):
    stock, elastic = runs
    assert stock["patches"] == []
    status = {p["patch"]: p["status"] for p in elastic["patches"]}
    assert {k: status[k] for k in ("elastic-mha-pool", "elastic-mla-pool",
                                   "elastic-token-allocator", "elastic-paged-allocator",
                                   "radix-cache-bound")} == dict.fromkeys(
        ("elastic-mha-pool", "elastic-mla-pool", "elastic-token-allocator",
         "elastic-paged-allocator", "radix-cache-bound"), "applied")
    assert status["kv-budget"] in ("applied", "skipped")


@pytest.mark.parametrize("page_size", ["1", "16"])
def test_flow_and_kv_round_trip_match_stock(runs, page_size):
    stock, elastic = runs
    s, e = stock["flows"][page_size], elastic["flows"][page_size]
    assert e["pool"] == "ElasticMHATokenToKVPool" and e["class"].startswith("Elastic")
    same = ("k_shape", "available0", "readback", "insert_a", "hit_b", "insert_b", "tree_tokens",
            "evictable_locked", "evicted", "available_after")
    assert {k: e[k] for k in same} == {k: s[k] for k in same}
    rs, re_ = stock["roundtrip"][page_size], elastic["roundtrip"][page_size]
    assert rs["k_equal"] and rs["v_equal"] and re_["k_equal"] and re_["v_equal"]
    assert re_["device"].startswith("cuda")


@pytest.mark.parametrize("page_size,layout", [("1", "contiguous"), ("16", "per_layer")])
def test_pages_map_and_unmap_move_device_memory(runs, page_size, layout):
    f = runs[1]["map_unmap"][page_size]
    pid = f["page_id"]
    assert f["layout"] == layout and f["null_mapped"] and f["mapped0"] == pid
    assert f["mapped_up"] == 5 * pid and f["mapped_down"] == pid
    grown = f["free_drop"] - f["zero_up"]  # zero pieces are shared, made once per size
    assert 4 * pid <= grown <= 4 * pid + 2 * MiB, f
    assert abs(f["free_back"] - f["zero_down"]) <= 2 * MiB, f
    assert f["alloc_miss"] is True
    if page_size == "16":
        assert f["alloc_extend_miss"] is True


@pytest.mark.parametrize("page_size", ["1", "16"])
def test_a_write_to_an_unbacked_slot_does_not_fault(runs, page_size):
    f = runs[1]["unbacked"][page_size]
    assert f == {"page_mapped": False, "no_fault": True, "zero_access": "readwrite"}


def test_a_page_is_unmapped_only_after_the_kernels_queued_before_its_free(runs):
    assert runs[1]["fence"] == {
        "state_after_free": "retired", "mapped_after_free": True, "pending": 1,
        "mapped_while_running": True, "state_after_sync": "free", "mapped_after_sync": False}


class Worker:
    def __init__(self, extra: dict[str, str]):
        self.p = _popen(SGL / "gpu_worker.py", {**ELASTIC, **extra}, stdin=subprocess.PIPE)

    def __call__(self, cmd: str, **kw) -> dict:
        self.p.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError(f"worker died on {cmd}: exit {self.p.wait()}")
        out = json.loads(line)
        assert out.pop("ok"), out
        return out

    def close(self) -> None:
        if self.p.poll() is None:
            self("quit")
            self.p.wait(timeout=60)


@pytest.fixture
def workers():
    made: list[Worker] = []
    yield lambda extra=None: made.append(Worker(extra or {})) or made[-1]
    for w in made:
        w.close()


def _kvctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", "kvctl", *args], env=_env({}),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_kvctl_limit_from_another_process_is_deferred_then_applied(workers):
    name = f"sglgpu{os.getpid()}"
    w = workers({"WORKBENCH_KV_IPC_NAME": name})
    s = w("open", size=64 * 1024, layers=2)
    pid = s["page_id"]  # 1024 slots of 2 KiB x 2 layers x K,V
    held = w("take", n=3 * 1024)
    assert held["got"] == 3 * 1024 and held["mapped"] == 4 * pid
    listed = json.loads(_kvctl("list", "--json").stdout)
    assert [r["owner_pid"] for r in listed if r["name"] == name] == [w.p.pid]
    out = _kvctl("limit", name, str(2 * pid), "--wait", "0")
    assert out.returncode == 0, out.stdout + out.stderr
    deferred = w("poll")
    assert deferred["outcome"] == "deferred" and deferred["mapped"] == 4 * pid
    applied = w("free_all")
    applied = w("poll")
    assert applied["outcome"] == "applied" and applied["limit"] == 2 * pid
    assert applied["mapped"] <= 2 * pid
    freed = applied["free"] - deferred["free"] + (applied["zero"] - deferred["zero"])
    _record("sglang_gpu_kvctl", {"held": held, "deferred": deferred, "applied": applied})
    assert freed >= deferred["mapped"] - applied["mapped"] - 2 * MiB, (deferred, applied)


def test_two_processes_share_one_gpu_through_the_elastic_path(workers):
    import torch

    total = torch.cuda.mem_get_info()[1]
    per_token = 4096 * 16  # 8 heads x 128 x fp16 x K,V x 16 layers
    size = int(0.6 * total) // per_token // 1024 * 1024
    half = int(0.5 * total) // per_token // 1024 * 1024
    a, b = workers(), workers()
    sa, sb = a("open", size=size, layers=16), b("open", size=size, layers=16)
    assert sa["capacity"] + sb["capacity"] > total  # together more than the GPU: virtual
    got_a = a("take", n=half)
    assert got_a["got"] == half
    miss = b("take", n=half)
    assert miss["got"] is None  # A holds the memory: B misses (None), nothing raised
    a("free_all")
    back = a("poll")
    assert back["mapped"] <= sa["page_id"]
    got_b = b("take", n=half)
    _record("sglang_gpu_sharing", {"a": [sa, got_a, back], "b": [sb, miss, got_b]})
    assert got_b["got"] == half and got_b["mapped"] >= half * per_token
    assert got_b["free"] <= back["free"] - half * per_token + 2 * MiB, (back, got_b)
