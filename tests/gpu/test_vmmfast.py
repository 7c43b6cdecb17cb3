"""The C fast path (vmmfast.c) on a CPU: built here, run against the C stand-in driver
(fakecuda.c), and compared call for call with the Python batch over the same library.

Both paths call the one C library (the Python batch through ctypes), which logs every call and
can fail the k-th, so the call sequence, the device's tables, the pool's events, the errors and
their ``partial`` can be compared exactly, at every fault point.
"""

from __future__ import annotations

import shutil
import subprocess
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.errors import DeviceError
from workbench.gpu import driver as drv
from workbench.gpu import fastcalls
from workbench.gpu.cfakedriver import CFakeDriver
from workbench.gpu.device import CudaDevice
from workbench.gpu.fakedriver import FakeDriver
from workbench.gpu.fastcalls import FastCalls, for_driver

from .scenario import run_sizes

SRC = Path(fastcalls.__file__).parent
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
SCENARIO = [64, 64, -1, 128, -1, -1, 100, 30, -1, -1, 64, -1] * 2  # (pages come back)


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> types.SimpleNamespace:
    if CC is None:
        pytest.skip("no C compiler: the C fast path cannot be built here")
    out = tmp_path_factory.mktemp("vmmfast")
    built = {}
    for name in ("vmmfast", "fakecuda"):
        so = out / f"_{name}.so"
        subprocess.run([CC, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(so),
                        str(SRC / f"{name}.c"), "-ldl"], check=True)
        built[name] = so
    return types.SimpleNamespace(fast=built["vmmfast"], fake=built["fakecuda"])


class Counting(FastCalls):
    """FastCalls that counts the C calls it makes (the fast path really ran)."""

    __slots__ = ("calls",)

    def _grow(self, n: int) -> None:
        super()._grow(n)
        self.calls = getattr(self, "calls", [0, 0])
        cmap, cunmap, arg, words, raw = self.hot

        def counted(fn, i):
            def call(a):
                self.calls[i] += 1
                return fn(a)
            return call

        self.hot = (counted(cmap, 0), counted(cunmap, 1), arg, words, raw)


def _device(libs, zero: bool, fast: bool) -> tuple[CFakeDriver, CudaDevice]:
    fake = CFakeDriver(libs.fake)  # resets the library's state
    path = Counting(libs.fast, str(libs.fake), fake) if fast else False
    with drv.use_driver(fake):
        dev = CudaDevice(0, zero_page=zero, mem_info_ttl_s=0.0, fast_path=path)
    return fake, dev


def _pool(dev, layout: Layout) -> KVCacheManager:
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=640,
                     layout=layout)
    cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, min_reserved_pages=0,
                     max_reserved_pages=1)
    return KVCacheManager(geo, dev, name="p", config=cfg)


def _outcome(libs, layout: Layout, zero: bool, fast: bool, sizes: list[int],
             fail_at: int = 0) -> dict:
    """Alloc and free in ``sizes`` order (negative: free the oldest), the ``fail_at``-th driver
    call after the pool is made failing; everything both paths must agree on."""
    fake, dev = _device(libs, zero, fast)
    kv = _pool(dev, layout)
    armed = fake.vmm_calls
    fake.fail(fail_at)
    with drv.use_driver(fake):  # (the driver names the error codes)
        outcome, _ = run_sizes(kv, sizes, catch=True)
    zero_pieces = dict(dev.zero._size) if dev.zero is not None else None
    return {"outcome": outcome, "events": kv.events.keys(), "log": fake.log(),
            "mappings": dict(dev.mappings), "counts": dict(dev.mappings.handles),
            "alloc": {h: s for h, (_, s) in dev._alloc.items()}, "zero": zero_pieces,
            "delta": dev._delta, "armed": armed, "calls": dev._fast.calls if fast else None}


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("zero", [False, True])
def test_both_paths_make_the_same_calls(libs, layout, zero):
    got = _outcome(libs, layout, zero, True, SCENARIO)
    want = _outcome(libs, layout, zero, False, SCENARIO)
    calls = got.pop("calls")
    want.pop("calls")
    assert got == want
    assert calls[0] >= 3 and calls[1] >= 3  # the grows and shrinks went through C
    assert not any(failed for *_, failed in got["log"])


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("zero", [False, True])
def test_a_failure_at_every_fault_point_leaves_the_same_state(libs, layout, zero):
    clean = _outcome(libs, layout, zero, False, SCENARIO)
    assert len(clean["log"]) - clean["armed"] > 10
    for k in range(1, len(clean["log"]) - clean["armed"] + 1):
        got = _outcome(libs, layout, zero, True, SCENARIO, fail_at=k)
        want = _outcome(libs, layout, zero, False, SCENARIO, fail_at=k)
        got.pop("calls")
        want.pop("calls")
        assert got == want, f"fault at call {k}"
        assert [e[5] for e in got["log"]].count(True) == 1  # the k-th call did fail


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(list(Layout)), zero=st.booleans(),
       sizes=st.lists(st.integers(-2, 200), min_size=1, max_size=20),
       fail_at=st.integers(0, 120))
def test_random_traces_agree(libs, layout, zero, sizes, fail_at):
    got = _outcome(libs, layout, zero, True, sizes, fail_at)
    want = _outcome(libs, layout, zero, False, sizes, fail_at)
    got.pop("calls")
    want.pop("calls")
    assert got == want


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize(("k", "op", "partial"), [
    (1, "create", ([], 0)), (2, "map", (1, 0)), (3, "set_access", (1, 1)),
    (4, "create", (1, 1)), (6, "set_access", (2, 2)), (9, "set_access", (3, 3))])
def test_the_error_and_partial_of_a_map_batch(libs, fast, k, op, partial):
    fake, dev = _device(libs, zero=False, fast=fast)
    g = dev.granularity
    va = dev.reserve(4 * g)
    fake.fail(k)
    with pytest.raises(DeviceError) as err, drv.use_driver(fake):  # (it names the error codes)
        dev.map_targets([(va, g), (va + g, g), (va + 2 * g, g)])
    created, mapped = err.value.partial
    assert err.value.op == op and str(err.value) == f"{op} failed: out of memory " \
                                                    "(code CUDA_ERROR_OUT_OF_MEMORY)"
    assert (len(created) if partial[0] else created, mapped) == partial
    assert sorted(dev.mappings) == [va + i * g for i in range(mapped)]
    assert sorted(dev._alloc) == created and dev._delta == len(created) * g
    assert (dev._fast.calls[0] == 1) if fast else dev._fast is None


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize(("k", "unmapped", "released"), [(1, 0, 0), (2, 1, 0), (3, 2, 0),
                                                         (4, 2, 1)])
def test_the_error_and_partial_of_an_unmap_release(libs, fast, zero, k, unmapped, released):
    fake, dev = _device(libs, zero=zero, fast=fast)
    g = dev.granularity
    va = dev.reserve(2 * g)
    targets = [(va, g), (va + g, g)]
    for _ in range(2):  # the second round finds exact zero pieces (their steady state)
        hs = dev.map_targets(targets)
        assert dev.unmap_release(targets, hs) is None
    hs = dev.map_targets(targets)
    fake.fail(k)
    if k <= 2:
        with pytest.raises(DeviceError, match="^unmap failed") as err:
            dev.unmap_release(targets, hs)
        assert err.value.partial == unmapped
    else:
        failed = dev.unmap_release(targets, hs)
        assert str(failed).startswith("release failed") and failed.partial == released
    assert sorted(dev.mappings) == [t[0] for t in targets[unmapped:]]
    assert sorted(dev._alloc) == sorted(hs[released:] if k > 2 else hs)
    if zero:  # the zeros are back on every target unmapped
        assert sorted(dev.zero._size) == [t[0] for t in targets[:unmapped]]
    assert (dev._fast.calls[1] == 3) if fast else dev._fast is None


def test_handles_from_c_work_with_every_python_call(libs):
    fake, dev = _device(libs, zero=True, fast=True)
    g = dev.granularity
    va = dev.reserve(4 * g)
    (h,) = dev.map_targets([(va, 2 * g)])
    dev.unmap(va, 2 * g)  # the per-call path on a handle the C path made
    dev.map(va + 2 * g, 2 * g, h)
    dev.set_access(va + 2 * g, 2 * g)
    dev.map_targets([(va, 2 * g)])
    dev.close()  # unmaps, releases (C handles too) and gives everything back
    assert fake.lib.fake_used() == 0 and fake.lib.fake_mappings() == 0
    assert [e[0] for e in fake.log()].count("release") >= 3


def test_the_path_is_chosen_once_from_the_driver(libs, tmp_path):
    assert for_driver(FakeDriver()) == (None, "off: the driver module is not backed by a C "
                                              "library")
    real = types.ModuleType("cuda.bindings.driver")
    assert fastcalls.driver_library(real) == fastcalls.DRIVER_SONAME
    cfake = CFakeDriver(libs.fake)
    fast, note = for_driver(cfake, libs.fast)
    assert isinstance(fast, FastCalls) and note == f"on ({libs.fake})"
    assert for_driver(cfake, tmp_path / "none.so") == (
        None, "off: none.so is not built (make vmmfast)")
    cfake.C_LIBRARY = str(tmp_path / "nodriver.so")
    fast, note = for_driver(cfake, libs.fast)
    assert fast is None and note.startswith("off: fast path failed: cannot open the driver")
    with drv.use_driver(FakeDriver()):
        assert CudaDevice(0)._fast is None  # a Python fake driver: the Python batch


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_skips_in_one_line_without_a_compiler():
    root = SRC.parents[1]
    r = subprocess.run(["make", "-s", "vmmfast", "CC=no-such-compiler"], cwd=root,
                       capture_output=True, text=True, check=True)
    assert r.stdout == ("vmmfast: no C compiler (no-such-compiler): skipped, the Python batch "
                        "is used\n")


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("zero", [False, True])
def test_bench_raw_c_makes_the_bare_calls_of_raw(libs, layout, zero, monkeypatch):
    """``bench vmm``'s raw_c subject issues _Raw's calls (from C, in one call each way), and
    the workbench on the C path the same ones again."""
    from workbench.bench import vmm

    monkeypatch.setattr(fastcalls, "LIBRARY", libs.fast)
    calls = {}
    fake = CFakeDriver(libs.fake)
    with drv.use_driver(fake):
        dev = CudaDevice(0, zero_page=zero, mem_info_ttl_s=60.0)
        geo = vmm.model_geometry(layout, 6, num_layers=2)
        subjects = vmm.raw_subjects(dev, dev, geo, 6)
        subjects["workbench"] = vmm._Workbench(dev, geo)
        assert set(subjects) == {"raw", "raw_zero", "raw_c", "raw_zero_c", "workbench"}
        for name in ("raw_zero", "raw_zero_c") if zero else ("raw", "raw_c"):
            s = subjects[name]
            for p in (1, 2):  # warm: zero pieces settle at the target size
                s.grow(p)
                s.shrink(p)
            n0 = len(fake.log())
            s.grow(1)
            s.shrink(1)
            calls[name] = sorted((op, size) for op, _, size, *_ in fake.log()[n0:])
        w = subjects["workbench"]
        for p in (1, 2):
            w.grow(p)
            w.shrink(p)
        n0 = len(fake.log())
        w.grow(1)
        w.shrink(1)
        calls["workbench"] = sorted((op, size) for op, _, size, *_ in fake.log()[n0:])
        for s in subjects.values():
            s.close()
        dev.close()
    n = geo.maps_per_page
    assert len(set(map(tuple, calls.values()))) == 1
    assert len(calls["workbench"]) == n * (8 if zero else 5)
    assert fake.lib.fake_used() == 0


def test_bench_grow_shrink_reports_every_pair_on_the_c_path(libs, monkeypatch):
    """With the fast path on, ``bench vmm`` times the C path, the Python batch beside it, and
    the bare calls from Python and from C, all interleaved."""
    from workbench.bench import vmm

    monkeypatch.setattr(fastcalls, "LIBRARY", libs.fast)
    with drv.use_driver(CFakeDriver(libs.fake)) as fake:
        r = vmm.grow_shrink(Layout.PER_LAYER, pages=3, rounds=2, num_layers=2)
    assert {p for p in vmm.PAIRS if f"ratio_grow_{p}" in r} == set(vmm.PAIRS)
    for pair, (a, b) in vmm.PAIRS.items():
        q = r[f"ratio_shrink_{pair}"]
        assert q["n"] == 2 and q["of_medians"] == pytest.approx(
            r[a]["shrink_us"] / r[b]["shrink_us"])
    assert fake.lib.fake_used() == 0 and fake.lib.fake_mappings() == 0


def test_pools_of_one_device_on_several_threads_take_turns(libs):
    """The C call releases the GIL and the job buffer is the device's: pools sharing a device
    on their own threads must not mix their batches."""
    import threading

    fake, dev = _device(libs, zero=False, fast=True)
    pools = [_pool(dev, Layout.CONTIGUOUS) for _ in range(3)]
    bpp = pools[0].geometry.page_size // pools[0].geometry.block_bytes
    errors: list[BaseException] = []

    def work(kv: KVCacheManager) -> None:
        try:
            for _ in range(300):
                ids = [kv.alloc(bpp) for _ in range(3)]
                for got in ids:
                    kv.free(got)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(kv,)) for kv in pools]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    mapped = {va for kv in pools for page in kv.space.handles for va, _ in kv.space.targets(page)}
    assert set(dev.mappings) == mapped and len(dev._alloc) == len(mapped)
    assert min(dev._fast.calls) > 3 * 300  # (a freed page may wait in the reserve)
    for kv in pools:
        assert kv.close() == []
    assert fake.lib.fake_used() == 0 and not dev.mappings
