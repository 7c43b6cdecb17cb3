"""The bandwidth probe's backing plans, repeat order and summaries (pure), and its raw backing
over the fake driver, on a CPU."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.bench import vmm_bw_probe as probe
from workbench.bench.vmm_bw_plan import (
    PIECE,
    VARIANTS,
    Handle,
    check_plan,
    per_page,
    plan,
    rotation,
)
from workbench.errors import ConfigError, DeviceError
from workbench.gpu.driver import use_driver
from workbench.gpu.fakedriver import FakeDriver

# (handles in all, handles per page id or None) for r regions of p pages (hchunk: of p chunks)
CREATES = {"h2m_page": lambda r, p: (r * p, r), "h2m_region": lambda r, p: (r * p, None),
           "h2m_rev": lambda r, p: (r * p, None), "h2m_shuf": lambda r, p: (r * p, None),
           "hbatch4": lambda r, p: (r * p, r), "hbatch8": lambda r, p: (r * p, r),
           "hchunk4": lambda r, p: (r * p, r), "hchunk8": lambda r, p: (r * p, r),
           "hpage": lambda r, p: (p, 1), "hregion": lambda r, p: (r, None),
           "hregion_2m": lambda r, p: (r, None)}


@given(st.sampled_from(VARIANTS), st.integers(1, 9), st.integers(1, 9))
def test_every_plan_maps_each_byte_of_every_region_once(variant, regions, pages):
    k = int(variant[6:]) if variant.startswith("hchunk") else 1
    hs = plan(variant, regions, pages * k)
    check_plan(hs, regions * pages * k * PIECE)  # raises on a gap, an overlap or a double map
    assert sum(h.size for h in hs) == regions * pages * k * PIECE  # every physical byte mapped
    total, per_id = CREATES[variant](regions, pages)
    assert len(hs) == total
    if per_id is None:
        assert all(h.page is None for h in hs)
    else:
        counts = [sum(h.page == p for h in hs) for p in range(pages)]
        assert counts == [per_id] * pages


def test_page_major_plans_create_in_growth_order():
    hs = plan("h2m_page", 3, 2)
    assert [(h.page, h.maps[0][0] // PIECE) for h in hs] == [
        (0, 0), (0, 2), (0, 4), (1, 1), (1, 3), (1, 5)]  # regions of 2 pieces: 0-1, 2-3, 4-5
    hp = plan("hpage", 3, 2)
    assert hp[1].maps == [(1 * PIECE, PIECE, 0), (3 * PIECE, PIECE, PIECE),
                          (5 * PIECE, PIECE, 2 * PIECE)]
    assert [h.maps[0][0] // PIECE for h in plan("h2m_rev", 2, 3)] == [2, 1, 0, 5, 4, 3]
    hb = plan("hbatch2", 2, 3)  # page ids 0-1 region by region, then page id 2
    assert [(h.page, h.maps[0][0] // PIECE) for h in hb] == [
        (0, 0), (1, 1), (0, 3), (1, 4), (2, 2), (2, 5)]
    hc = plan("hchunk2", 2, 4)  # 4 MiB pieces, page id by page id
    assert [(h.page, h.size // PIECE, h.maps[0][0] // PIECE) for h in hc] == [
        (0, 2, 0), (0, 2, 4), (1, 2, 2), (1, 2, 6)]
    assert sorted(h.maps[0][0] for h in plan("h2m_shuf", 3, 3)) == [
        h.maps[0][0] for h in plan("h2m_region", 3, 3)]
    assert plan("hregion_2m", 2, 3)[1].maps == [(3 * PIECE, PIECE, 0), (4 * PIECE, PIECE, PIECE),
                                                (5 * PIECE, PIECE, 2 * PIECE)]


@pytest.mark.parametrize(("handles", "total", "why"), [
    ([Handle(PIECE, [(0, PIECE, 0)])], 2 * PIECE, "covers"),
    ([Handle(PIECE, [(PIECE, PIECE, 0)])], 2 * PIECE, "expected the next one at 0"),
    ([Handle(2 * PIECE, [(0, PIECE, 0), (PIECE, PIECE, 0)])], 2 * PIECE, "a byte twice"),
    ([Handle(PIECE, [(0, PIECE, PIECE)])], PIECE, "past its size"),
    ([Handle(PIECE, [(0, PIECE, 0)]), Handle(PIECE, [])], PIECE, "maps nothing"),
])
def test_check_plan_refuses_a_bad_cover(handles, total, why):
    with pytest.raises(ConfigError, match=why):
        check_plan(handles, total)


def test_plan_refuses_unknown_variants_and_empty_sizes():
    with pytest.raises(ConfigError, match="no such backing"):
        plan("h1g", 2, 2)
    with pytest.raises(ConfigError, match="positive"):
        plan("hpage", 0, 2)
    with pytest.raises(ConfigError, match="multiple of 4"):
        plan("hchunk4", 2, 6)


def test_per_page_sums_the_handles_of_each_page_id():
    hs = plan("h2m_page", 2, 3)
    assert per_page([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], hs) == [3.0, 7.0, 11.0]
    assert per_page([1.0, 2.0], plan("hregion", 2, 3)) == []


@given(st.lists(st.text(min_size=1), min_size=1, max_size=9, unique=True),
       st.integers(0, 50))
def test_rotation_permutes_and_every_subject_takes_every_position(names, r):
    assert sorted(rotation(names, r)) == sorted(names)
    n = len(names)
    positions = {rotation(names, k).index(names[0]) for k in range(2 * n)}
    assert positions == set(range(n))
    a, b = rotation(names, 2 * r), rotation(names, 2 * r + 1)  # each pair swaps order
    assert all((a.index(x) < a.index(y)) == (b.index(x) > b.index(y))
               for x in names for y in names if x != y)


class OffsetDriver(FakeDriver):
    """The fake driver, but a mapping may take any granularity-aligned part of a handle."""

    def cuMemMap(self, va, size, offset, handle, flags):
        self.calls += 1
        have = self.allocs.get(handle)
        if have is None or offset % self.granularity or offset + size > have or va in self.maps:
            return (1,)  # CUDA_ERROR_INVALID_VALUE
        self.maps[va] = size
        return (0,)


@pytest.mark.parametrize("variant", VARIANTS)
def test_raw_backing_maps_its_plan_and_gives_everything_back(variant):
    fake = OffsetDriver()
    with use_driver(fake):
        hs = plan(variant, 2, 8)
        rb = probe.RawBacking(hs, 16 * PIECE)
        assert sorted(v - rb.base for v in fake.maps) == sorted(v for h in hs for v, _, _ in h.maps)
        assert sorted(fake.allocs.values()) == sorted(h.size for h in hs)
        assert len(rb.grow_s) == len(hs)
        assert len(rb.close()) == len(hs)
    assert fake.maps == {} and fake.allocs == {} and fake.reserved == {}


def test_raw_backing_undoes_a_plan_the_driver_refuses():
    fake = FakeDriver()  # maps whole handles only: hpage's first offset map fails
    with use_driver(fake), pytest.raises(DeviceError, match="map"):
        probe.RawBacking(plan("hpage", 4, 3), 12 * PIECE)
    assert fake.maps == {} and fake.allocs == {} and fake.reserved == {}


def test_measure_reports_each_subjects_ratio_to_plain_per_repeat(monkeypatch):
    """The aggregation alone: times are scripted per subject and repeat, no GPU."""
    subj = probe.Subjects()
    subj.regions = {"plain_each": ["p"], "slow": ["s"], "fast": ["f"]}
    seen: list[str] = []
    calls = {"plain_each": 0, "slow": 0, "fast": 0}
    base = {"plain_each": 1.0, "slow": 1.25, "fast": 0.8}

    def times(fn, reps):
        name = fn()
        seen.append(name)
        calls[name] += 1
        return 2 * base[name], base[name] * (1 + 0.01 * calls[name])  # drifts each repeat

    monkeypatch.setattr(probe, "_fill", lambda ts, seed: None)
    monkeypatch.setattr(probe, "_ext_kernel", lambda kind, ts: ((lambda: {
        "p": "plain_each", "s": "slow", "f": "fast"}[ts[0]]), 4000))
    monkeypatch.setattr(probe, "_times", times)
    out = probe._measure(subj, "add", repeats=4, reps=3)
    assert seen[:6] == ["plain_each", "slow", "fast", "fast", "slow", "plain_each"]
    assert out["bytes_moved"] == 4000
    s = out["subjects"]
    assert s["plain_each"]["ratios"] == [1.0] * 4
    assert s["slow"]["ratios"] == pytest.approx([0.8] * 4)
    assert s["fast"]["first_ratio"]["median"] == pytest.approx(1.25)
    assert s["slow"]["ratio_before_ref"]["n"] == 2 and s["slow"]["ratio_after_ref"]["n"] == 2
    assert s["plain_each"]["TBps"] == pytest.approx(4000 / (1.025) / 1e12)


def test_summary_lines_name_every_subject_kernel_and_page_cost():
    q = {"median": 0.97, "p10": 0.96, "p90": 0.98, "n": 10}
    sub = {"TBps": 4.1, "ratio": q, "first_ratio": q, "ratio_before_ref": q,
           "ratio_after_ref": q}
    res = {"runs": [{"region_MiB": 64, "kernels": {"add": {"subjects": {"wb": sub}}},
                     "grow_us_per_page_id": {"hpage": {"median": 90.0, "p10": 80.0,
                                                       "p90": 99.0, "n": 32}},
                     "page_id_MiB": {"hpage": 128},
                     "skipped": {"hpage": "map failed"}, "plain_segments": {"plain_each": 64}}]}
    assert probe.summary_lines(res) == [
        "probe 64 MiB x 64 add  wb           /plain_each 0.9700 [p10 0.9600, p90 0.9800] n=10 "
        "4.100 TB/s; first-run ratio 0.970; before/after ref 0.9700/0.9700",
        "probe 64 MiB x 64 grow per page id (128 MiB) hpage     median 90 us [p10 80, p90 99] "
        "n=32, 720 us/GiB",
        "probe 64 MiB x 64 skipped hpage: map failed",
        "probe 64 MiB x 64 plain segments {'plain_each': 64}"]


def test_bench_summary_names_every_pairing_with_its_spread():
    from workbench.bench import vmm_bw

    q = {"median": 0.9919, "p10": 0.9914, "p90": 0.9925, "n": 10}
    bw = {"goal": 0.99, "pairings": {"per_layer_8MiB_add": {
        "ratio": q, "vmm_TBps": 3.806, "plain_TBps": 3.837, "launches": 64}}}
    assert vmm_bw.summary_lines(bw) == [
        "bandwidth per_layer_8MiB_add  vmm/plain median 0.9919 [p10 0.9914, p90 0.9925] over 10 "
        "repeats; 3.806 vs 3.837 TB/s, 64 launch(es) each side (goal >= 0.99)"]
    assert [(n, lay.value, ps >> 20) for n, lay, ps in vmm_bw.PAIRINGS] == [
        ("contiguous", "contiguous", 2), ("per_layer", "per_layer", 2),
        ("per_layer_8MiB", "per_layer", 8)]
