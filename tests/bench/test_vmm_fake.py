"""``workbench bench vmm``'s grow/shrink and warm-alloc parts, run on a CPU over the fake driver."""

from __future__ import annotations

import json
import threading

import pytest
from typer.testing import CliRunner

from workbench.bench import vmm
from workbench.cli import app
from workbench.core.geometry import Layout
from workbench.gpu import cfakedriver, fastcalls
from workbench.gpu.driver import use_driver
from workbench.gpu.fakedriver import FakeDriver


@pytest.mark.parametrize("layout", list(Layout))
def test_grow_shrink_reports_interleaved_ratios_with_spread(layout):
    with use_driver(FakeDriver()):
        r = vmm.grow_shrink(layout, pages=3, rounds=4, num_layers=2)
    assert r["rounds"] == 4 and r["pages_timed"] == 12
    assert r["maps_per_page_id"] == (1 if layout is Layout.CONTIGUOUS else 4)
    # a Python fake driver has no C library: no bare calls from C to compare with, and no
    # Python batch beside a C one
    c_pairs = {p for p in vmm.PAIRS if p.endswith(("_c", "_py"))}
    assert {p for p in vmm.PAIRS if f"ratio_grow_{p}" in r} == set(vmm.PAIRS) - c_pairs
    for pair, (a, b) in vmm.PAIRS.items():
        if pair in c_pairs:
            continue
        for kind in ("grow", "shrink"):
            q = r[f"ratio_{kind}_{pair}"]
            assert q["n"] == 4 and q["p10"] <= q["median"] <= q["p90"]
            assert q["of_medians"] == pytest.approx(r[a][f"{kind}_us"] / r[b][f"{kind}_us"])


def test_abab_alternates_the_order_every_round():
    seen = []

    class Subject:
        def __init__(self, name):
            self.name = name

        def grow(self, p):
            seen.append(("g", self.name, p))

        def shrink(self, p):
            seen.append(("s", self.name, p))

    raw = vmm._abab({"A": Subject("A"), "B": Subject("B")}, pages=2, rounds=2)
    assert seen == [("g", "A", 1), ("g", "B", 1), ("g", "A", 2), ("g", "B", 2),
                    ("s", "A", 1), ("s", "B", 1), ("s", "A", 2), ("s", "B", 2),
                    ("g", "B", 1), ("g", "A", 1), ("g", "B", 2), ("g", "A", 2),
                    ("s", "B", 1), ("s", "A", 1), ("s", "B", 2), ("s", "A", 2)]
    assert [len(rnd) for rnd in raw["A"]["grow"]] == [2, 2]


@pytest.mark.parametrize("layout", list(Layout))
def test_warm_alloc_deferred_refill_never_maps_on_the_request_path(layout):
    fake = FakeDriver()
    with use_driver(fake):
        r = vmm.warm_alloc(layout, per_cycle=12, cycles=2)
    assert {m: r[m]["n"] for m in vmm.WARM_MODES} == {
        "inline": 24, "deferred": 24, "mapper": 24, "cold": 24}
    assert fake.used == 0 and not fake.maps  # everything given back


class ThreadCountingDriver(FakeDriver):
    """Counts the VMM calls each thread makes."""

    def __init__(self):
        super().__init__()
        self.by_thread: dict[int, int] = {}
        for name in ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"):
            setattr(self, name, self._count(getattr(FakeDriver, name).__get__(self)))

    def _count(self, fn):
        def call(*args):
            t = threading.get_ident()
            self.by_thread[t] = self.by_thread.get(t, 0) + 1
            return fn(*args)
        return call


def test_warm_alloc_modes_map_where_they_say(monkeypatch):
    """The engine thread's driver calls inside each timed alloc: deferred and mapper none, cold
    and inline one page's worth (create + zero-piece unmap + map + set-access)."""
    calls: dict[str, list[int]] = {}
    real = vmm.time.perf_counter
    fake = ThreadCountingDriver()
    me = threading.get_ident()
    state: dict = {"t0": None}

    def clock():
        if threading.get_ident() == me:
            n = fake.by_thread.get(me, 0)
            if state["t0"] is None:
                state["t0"] = n
            else:
                calls.setdefault(state["mode"], []).append(n - state["t0"])
                state["t0"] = None
        return real()

    monkeypatch.setattr(vmm.time, "perf_counter", clock)
    modes = iter(vmm.WARM_MODES)
    for name in ("KVCacheManager", "LockedKVCacheManager"):
        def make(*a, _orig=getattr(vmm, name), **kw):
            state["mode"], state["t0"] = next(modes), None
            return _orig(*a, **kw)
        monkeypatch.setattr(vmm, name, make)
    with use_driver(fake):
        vmm.warm_alloc(Layout.CONTIGUOUS, per_cycle=12, cycles=1)
    assert set(calls["deferred"]) == {0}  # an already-mapped page, nothing else
    assert set(calls["mapper"]) == {0}  # the background thread mapped it
    assert set(calls["cold"]) == {4}
    # inline: the reserve drops below min_reserved on every alloc of a growing pool, and the
    # alloc refills it on the spot: one page's map on the request path, every time
    assert set(calls["inline"]) == {4}
    assert len(fake.by_thread) == 2  # the mapper's thread did map


def test_run_vmm_without_bandwidth_and_its_summary(tmp_path):
    with use_driver(FakeDriver()):
        res = vmm.run_vmm(pages=2, rounds=2, with_bandwidth=False)
    lines = vmm.summary_lines(res)
    assert len(lines) == 2 * 3 * 2 + 2 + 1
    assert lines[0].startswith("vmm contiguous grow   workbench_nozero/raw: median ")
    assert lines[-1] == "vmm C fast path: off: the driver module is not backed by a C library"
    assert res["goals"]["grow_shrink_ratio_max"] == 1.10
    json.dumps(res)  # the record is plain JSON


def test_cli_overhead_prints_one_line_per_layout_and_kind(tmp_path):
    out = tmp_path / "o.json"
    r = CliRunner().invoke(app, ["bench", "overhead", "--pages", "3", "--rounds", "2",
                                 "--repeats", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert [ln.split()[1:3] for ln in r.output.splitlines()
            if ln.startswith("overhead") and "split" not in ln] == [
        ["contiguous", "grow"], ["contiguous", "shrink"], ["per_layer", "grow"],
        ["per_layer", "shrink"]]
    c_split = {"split_contiguous_c_cpu_us"} if (
        fastcalls.LIBRARY.exists() and cfakedriver.LIBRARY.exists()) else set()
    assert set(json.loads(out.read_text())) == {"contiguous", "per_layer",
                                                 "split_contiguous_cpu_us"} | c_split
