"""The adapters' shared runtime without a GPU: device keys, one device per key, the release fence
(with stand-in CUDA events), the per-process KV budget, and optional patch targets that cannot
be imported here."""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench import backends
from workbench.adapters import boot, runtime
from workbench.adapters.registry import EnginePlan, Patch
from workbench.adapters.sglang.budget import virtual_budget
from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.errors import ConfigError
from workbench.units import GiB


def test_engine_devices_map_to_backend_names():
    from workbench.backends import for_torch_device

    assert for_torch_device("cpu") == "host" and for_torch_device("cuda:3") == "cuda:3"
    with pytest.raises(ConfigError, match=r"the host \(cpu\) and CUDA GPUs"):
        for_torch_device("xpu:0")


def test_one_host_device_per_process_and_a_host_ledger_has_no_fence():
    assert backends.shared_device("cpu") is backends.shared_device("cpu")
    cfg = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=0)
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=1, num_blocks=4096,
                     layout=Layout.CONTIGUOUS)
    kv = runtime.make_ledger(geo, backends.shared_device("cpu"), "t", cfg)
    try:
        assert kv.fence is None and not kv.pages.defer_release and kv in runtime.ledgers
        assert kv.name.startswith("t-")
    finally:
        kv.close()
        runtime.ledgers.remove(kv)


def test_a_device_with_queued_work_gets_a_fenced_ledger():
    """The fence follows what the device says (``queued_work``), not its name: a CUDA device
    (over the instant driver here) defers releases behind one, the host device does not."""
    from workbench.gpu.device import CudaDevice
    from workbench.gpu.driver import use_driver
    from workbench.gpu.fakedriver import FakeDriver

    assert not backends.shared_device("cpu").queued_work
    cfg = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=0)
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=640,
                     layout=Layout.CONTIGUOUS)
    with use_driver(FakeDriver()):
        dev = CudaDevice(0, zero_page=False, fast_path=False)
        assert dev.queued_work
        kv = runtime.make_ledger(geo, dev, "q", cfg)
        try:
            assert isinstance(kv.fence, runtime.ReleaseFence) and kv.pages.defer_release
        finally:
            kv.close()
            runtime.ledgers.remove(kv)
            dev.close()


class FakeEvent:
    """A CUDA event stand-in: completes when the test says the GPU got there."""

    done_through = -1  # events recorded at or before this tick have completed
    tick = 0

    def __init__(self):
        self.at = None

    def record(self, stream=None):
        self.at = FakeEvent.tick
        self.stream = stream

    def query(self):
        return self.at <= FakeEvent.done_through

    def synchronize(self):
        FakeEvent.done_through = max(FakeEvent.done_through, self.at)


@pytest.fixture
def fake_cuda(monkeypatch):
    torch = pytest.importorskip("torch")
    FakeEvent.done_through, FakeEvent.tick = -1, 0
    capturing = {"on": False}
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: "current")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["on"])
    monkeypatch.setattr(runtime, "streams", ["forward"])
    return capturing


def _deferred_ledger():
    cfg = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=0)
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=1, num_blocks=4096,
                     layout=Layout.CONTIGUOUS)
    from workbench.core.ledger import KVCacheManager

    kv = KVCacheManager(geo, backends.shared_device("cpu"), name="fenced", config=cfg,
                        defer_release=True)
    kv.fence = runtime.ReleaseFence(kv)
    return kv


def test_fence_unmaps_only_after_every_watched_stream_passed_the_free(fake_cuda):
    kv = _deferred_ledger()
    try:
        ids = kv.alloc(2048)  # pages 0 (null block's) .. 2
        FakeEvent.tick = 1
        kv.free(ids)
        kv.fence.after_free()
        marker, events = kv.fence.pending[0]
        assert [e.stream for e in events] == ["current", "forward"]
        assert kv.mapped_bytes == 3 * kv.geometry.page_id_bytes  # retired, still mapped
        assert kv.fence.poll() == 0  # the GPU has not got there
        FakeEvent.done_through = 1
        assert kv.fence.poll() == 2 and kv.mapped_bytes == kv.geometry.page_id_bytes
        assert kv.fence.pending == []
        kv.check_invariants()
    finally:
        kv.close()


def test_fence_records_nothing_during_graph_capture_and_drain_waits(fake_cuda):
    kv = _deferred_ledger()
    try:
        ids = kv.alloc(1024 + 1023)
        kv.free(ids)
        fake_cuda["on"] = True
        kv.fence.after_free()
        assert kv.fence.pending == [] and kv.fence.drain() == 0  # nothing during capture
        fake_cuda["on"] = False
        FakeEvent.tick = 5
        kv.fence.after_free()
        kv.fence.after_free()  # nothing retired since: no second marker
        assert len(kv.fence.pending) == 1
        assert kv.fence.drain() == 1 and kv.mapped_bytes == kv.geometry.page_id_bytes
    finally:
        kv.close()


@given(total=st.integers(1 * GiB, 200 * GiB), util=st.floats(0.05, 1.0),
       reserved=st.integers(0, 100 * GiB), frac=st.floats(0.1, 1.0))
def test_virtual_budget_is_budget_minus_weights_minus_slack(total, util, reserved, frac):
    budget = int(total * util)
    expect = budget - reserved - int((1.0 - frac) * budget)
    if expect <= 0:
        with pytest.raises(ConfigError, match="WORKBENCH_KV_GPU_UTILIZATION"):
            virtual_budget(total, util, reserved, frac)
    else:
        assert virtual_budget(total, util, reserved, frac) == expect


def test_virtual_budget_does_not_depend_on_other_processes():
    # 141 GiB H200, 16 GiB of weights, mem_fraction_static 0.88, utilization 0.9: the same
    # number whatever the device's free memory is (a second engine starts like the first)
    assert virtual_budget(141 * GiB, 0.9, 16 * GiB, 0.88) == (
        int(141 * GiB * 0.9) - 16 * GiB - int(0.12 * int(141 * GiB * 0.9)))


@contextlib.contextmanager
def fake_engine(tmp_path, monkeypatch, name: str) -> Iterator[None]:
    """Package ``name`` (version 1.0) on sys.path whose ``core`` imports and whose ``server``
    needs a missing dependency; afterwards the boot registry is reset and the package gone."""
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '1.0'\n")
    (pkg / "core.py").write_text("X = 1\n")
    (pkg / "server.py").write_text("import no_such_dependency_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield
    finally:
        boot.reset()
        for module in [m for m in sys.modules if m.split(".")[0] == name]:
            del sys.modules[module]


def test_an_optional_patch_whose_module_cannot_import_is_skipped_with_the_reason(tmp_path,
                                                                                   monkeypatch):
    applied = []

    def patch(name, module, required):
        return Patch(name, module, ">=1.0,<2", apply=lambda m: applied.append(name) or (
            lambda: None), required=required)

    with fake_engine(tmp_path, monkeypatch, "optengine"):
        plan = boot.register(EnginePlan("optengine", "optengine", ("optengine",), [
            patch("core-patch", "optengine.core", True),
            patch("server-patch", "optengine.server", False)]))
        import optengine.core  # noqa: F401

        assert plan.state == "applied" and applied == ["core-patch"]
        rec = {r.patch: (r.status, r.detail) for r in plan.records}
        assert rec["core-patch"] == ("applied", "")
        assert rec["server-patch"][0] == "skipped"
        assert "no_such_dependency_here" in rec["server-patch"][1]


def test_a_required_patch_whose_module_cannot_import_refuses_the_plan(tmp_path, monkeypatch):
    from workbench.adapters.registry import AutopatchError

    with fake_engine(tmp_path, monkeypatch, "reqengine"):
        plan = boot.register(EnginePlan("reqengine", "reqengine", ("reqengine",), [
            Patch(n, m, ">=1.0", apply=lambda mod: (lambda: None))
            for n, m in (("a", "reqengine.core"), ("b", "reqengine.server"))]))
        with pytest.raises(AutopatchError, match="cannot import reqengine.server"):
            import reqengine.core  # noqa: F401
        assert plan.state == "failed"


def test_watch_stream_keeps_each_stream_once(monkeypatch):
    monkeypatch.setattr(runtime, "streams", [])
    s = types.SimpleNamespace()
    runtime.watch_stream(s)
    runtime.watch_stream(s)
    runtime.watch_stream(None)
    assert runtime.streams == [s]


def test_the_budget_patch_ignores_the_devices_free_memory(monkeypatch):
    torch = pytest.importorskip("torch")
    from workbench.adapters.sglang.budget import make_profile

    total, weights = 141 * GiB, 16 * GiB
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: weights)
    monkeypatch.setenv("WORKBENCH_KV_GPU_UTILIZATION", "0.9")
    module = types.SimpleNamespace(
        get_schedule=lambda: types.SimpleNamespace(mem_fraction_static=0.88))
    configurator = types.SimpleNamespace(device="cuda:0", gpu_id=0)
    profile = make_profile(lambda self, pre: pytest.fail("stock profile on CUDA"), module)
    got = []
    for free in (130 * GiB, 3 * GiB):  # alone on the GPU, or beside another engine
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index, f=free: (f, total))
        got.append(profile(configurator, 120.0))
    assert got == [virtual_budget(total, 0.9, weights, 0.88)] * 2
    cpu = types.SimpleNamespace(device="cpu", gpu_id=0)
    assert make_profile(lambda self, pre: 123, module)(cpu, 1.0) == 123  # CPU: stock


def test_the_leak_check_patch_hands_sglang_the_unheld_slots():
    from dataclasses import dataclass

    from workbench.adapters.sglang.budget import make_leak_check

    @dataclass
    class Stats:
        full_available_size: int
        full_evictable_size: int

    seen = []
    check = make_leak_check(lambda self, ps, uncached=0: seen.append((ps, uncached)) or "ok")
    elastic = types.SimpleNamespace(token_to_kv_pool_allocator=types.SimpleNamespace(
        unheld_size=lambda: 7192))
    stock = types.SimpleNamespace(token_to_kv_pool_allocator=object())
    assert check(elastic, Stats(5143, 0), uncached=3) == "ok"
    assert check(stock, Stats(5143, 0)) == "ok"
    assert seen == [(Stats(7192, 0), 3), (Stats(5143, 0), 0)]


def test_the_overlap_schedulers_forward_stream_is_watched_once_the_runner_is_built(monkeypatch):
    from workbench.adapters.sglang import seams

    class ModelRunner:
        def __init__(self, stream):
            self.forward_stream = stream

    monkeypatch.setattr(runtime, "streams", [])
    module = types.SimpleNamespace(ModelRunner=ModelRunner)
    seams.watch_forward_stream(seams.RUNNER, module)
    seams.watch_forward_stream(seams.RUNNER, module)  # a second load wraps nothing again
    first, second = object(), object()
    ModelRunner(first)
    ModelRunner(second)
    assert runtime.streams == [first, second]
