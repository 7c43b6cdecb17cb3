"""Chapter 08's measuring tools: run orders, timing with a load switched on part-way, small-sample
percentiles, figures and the record table."""

from __future__ import annotations

import itertools
import sys
from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.errors import ConfigError
from workbench.viz.honest import (
    BackgroundLoad,
    Timing,
    cdf_figure,
    median_ratio,
    record_rows,
    schedule,
    spread_figure,
    subset_percentiles,
    time_runs,
    timing_figure,
)


def test_schedules():
    assert schedule("blocked", 3) == ["A", "A", "A", "B", "B", "B"]
    assert schedule("alternate", 3) == ["A", "B", "B", "A", "A", "B"]
    with pytest.raises(ConfigError, match="is not a run order"):
        schedule("random", 2)
    with pytest.raises(ConfigError, match="at least 1"):
        schedule("blocked", 0)


@given(st.integers(1, 30), st.sampled_from(["blocked", "alternate"]))
def test_every_variant_runs_equally_often(rounds, order):
    s = schedule(order, rounds)
    assert s.count("A") == s.count("B") == rounds
    if order == "alternate":  # each half of an even number of rounds holds as many A as B
        half = s[:len(s) // 2] if rounds % 2 == 0 else s
        assert half.count("A") == half.count("B")


def test_time_runs_with_a_fake_clock_and_load():
    ticks = itertools.count()
    calls: list[str] = []
    fns = {"A": lambda: calls.append("A"), "B": lambda: calls.append("B")}
    load = BackgroundLoad()
    ts = time_runs(fns, "blocked", 2, load_from=2, load=load, clock=lambda: next(ticks))
    assert calls == ["A", "A", "B", "B"]
    assert ts == [Timing(0, "A", 1, False), Timing(1, "A", 1, False),
                  Timing(2, "B", 1, True), Timing(3, "B", 1, True)]
    assert not load.on  # switched off at the end
    with pytest.raises(ConfigError, match="nothing would be switched on"):
        time_runs(fns, "blocked", 1, load_from=0)


def test_median_ratio_and_timing_figure():
    ts = [Timing(0, "A", 1.0, False), Timing(1, "B", 3.0, True), Timing(2, "A", 2.0, False),
          Timing(3, "B", 5.0, True)]
    assert median_ratio(ts) == (3.0 / 1.0 + 5.0 / 2.0) / 2  # pairs (A1, B1), (A2, B2)
    fig = timing_figure({"blocked": ts, "alternate": ts})
    assert fig.layout.annotations[0].text == "blocked: B/A = 2.75"
    assert [tr.name for tr in fig.data] == ["A", "B", "A", "B"]


def test_background_load_starts_and_stops_once():
    before = sys.getswitchinterval()
    load = BackgroundLoad(switch_s=0.0005)
    load.start()
    load.start()  # idempotent
    assert load.on and sys.getswitchinterval() == pytest.approx(0.0005)
    load.stop()
    load.stop()
    assert not load.on and sys.getswitchinterval() == before


def test_subset_percentiles():
    xs = list(range(100))
    assert subset_percentiles(xs, n=100, k=3, q=50) == [49.5] * 3  # the whole sample each time
    small = subset_percentiles(xs, n=2, k=50, q=99, seed=1)
    assert len(small) == 50 and all(0 <= v <= 99 for v in small)
    assert subset_percentiles(xs, 10, 5, seed=7) == subset_percentiles(xs, 10, 5, seed=7)
    with pytest.raises(ConfigError, match="between 1 and the 100 samples"):
        subset_percentiles(xs, n=101, k=1)


def test_cdf_and_spread_figures():
    fig = cdf_figure({"x": [1, 2, 3, 4]})
    assert list(fig.data[0].y) == [0.25, 0.5, 0.75, 1.0]
    assert fig.layout.shapes[0].x0 == 2.5  # the mean line
    assert fig.data[1].text == ("p50 2", "p99 4")
    rows = [{"seed": 0, "p": "a", "v": 1.0}, {"seed": 1, "p": "a", "v": 2.0},
            {"seed": 0, "p": "b", "v": 3.0}]
    sp = spread_figure(rows, x="seed", y="v", group="p")
    assert [(t.name, list(t.y)) for t in sp.data] == [("a", [1.0, 2.0]), ("b", [3.0])]


def test_record_rows_keep_every_field_and_say_not_measured():
    from workbench.labs.idle_footprint.report import record
    from workbench.labs.kit.record import LabRecord

    rows_in = [{"engine": "vllm", "page_aware": True, "requests": 5, "prefix_hit_tokens": 1,
                "prompt_tokens": 2}]
    rec = record(rows_in, seed=3, backend="sim")
    rows = dict(record_rows(rec, width=40))
    assert list(rows)[:2] == ["experiment_id", "hypothesis"] and "manifest" not in rows
    assert rows["transfer_bytes"] == "not measured" and rows["correctness"] == "not measured"
    assert rows["environment"] == '{"backend":"sim","seed":3,"requests":5}'
    assert all(len(v) <= 40 for v in rows.values())
    assert len(rows) == len(fields(LabRecord)) - 3 == 23  # all but manifest, results, schema
