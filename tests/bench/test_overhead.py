"""``workbench bench overhead``: the workbench's Python per page id over the instant fake driver."""

from __future__ import annotations

import pytest

from workbench.bench import vmm
from workbench.bench.overhead import H200_RAW_US, run_overhead, summary_lines
from workbench.core.geometry import Layout
from workbench.gpu import cfakedriver, fastcalls
from workbench.gpu.device import CudaDevice
from workbench.gpu.driver import use_driver
from workbench.gpu.fakedriver import FakeDriver


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("zero", [False, True])
def test_workbench_and_raw_make_the_same_driver_calls_per_page_id(layout, zero):
    """Like for like: once warm, a grow and a shrink through the workbench issue exactly the
    bare baseline's create/map/set-access/unmap/release calls, and no cuMemGetInfo."""
    counts = {}
    for name in ("raw", "workbench"):
        fake = FakeDriver()
        with use_driver(fake):
            dev = CudaDevice(0, zero_page=zero, mem_info_ttl_s=60.0)
            geo = vmm.model_geometry(layout, 6)
            s = vmm._Raw(dev, geo, 6, zero) if name == "raw" else vmm._Workbench(dev, geo)
            for p in (1, 2):  # warm: zero pieces settle at the target size
                s.grow(p)
                s.shrink(p)
            before, info = fake.calls, fake.info_calls
            s.grow(1)
            s.shrink(1)
            counts[name] = (fake.calls - before, fake.info_calls - info)
            s.close()
            dev.close()
    n = geo.maps_per_page
    per_target = 5 + (3 if zero else 0)  # + zero swap: unmap on grow, map + set-access on shrink
    assert counts["raw"] == counts["workbench"] == (n * per_target, 0)


def test_run_overhead_reports_every_subject_and_the_budget():
    res = run_overhead(pages=4, rounds=2, repeats=1)
    # the C fast path's split comes where its library and the C stand-in driver are built
    c_split = fastcalls.LIBRARY.exists() and cfakedriver.LIBRARY.exists()
    assert set(res) == {"contiguous", "per_layer", "split_contiguous_cpu_us"} | (
        {"split_contiguous_c_cpu_us"} if c_split else set())
    layers = ["raw driver", "+ CudaDevice batch", "+ KVSpace", "+ page allocator",
              "+ ledger (alloc + free)"]
    assert list(res["split_contiguous_cpu_us"]) == layers
    if c_split:
        assert list(res["split_contiguous_c_cpu_us"]) == layers
    for lay in ("contiguous", "per_layer"):
        r = res[lay]
        assert r["maps_per_page_id"] == (1 if lay == "contiguous" else 64)
        for kind in ("grow", "shrink"):
            assert r[f"added_{kind}_us"] == pytest.approx(
                r["workbench_nozero"][f"{kind}_us"] - r["raw"][f"{kind}_us"])
            assert r[f"budget_{kind}_us"] == pytest.approx(0.1 * H200_RAW_US[lay][kind])
    lines = summary_lines(res)
    k = 10 if c_split else 5
    assert len(lines) == k + 4 and lines[k].startswith("overhead contiguous grow")
