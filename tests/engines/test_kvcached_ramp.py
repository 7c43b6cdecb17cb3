"""kvcached's ramp trace as its script sends it: rates, stagger, tails, lengths, determinism."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.engines.sim.workloads import (
    VOCAB,
    kvcached_ramp_arrivals,
    kvcached_ramp_counts,
    kvcached_ramp_delay,
    kvcached_ramp_rates,
    kvcached_ramp_traces,
    ramp_arrivals,
)
from workbench.errors import ConfigError

peaks = st.integers(1, 40)
models = st.integers(1, 5)


@given(peaks)
def test_the_rate_climbs_and_falls_by_one_request_per_second(peak):
    rates = kvcached_ramp_rates(peak)
    assert rates[0] == 1 and rates[-1] == 1 and max(rates) == peak
    if peak >= 2:
        assert rates.count(peak) == 1 and len(rates) == 2 * peak - 1
        assert all(abs(b - a) == 1 for a, b in zip(rates, rates[1:], strict=False))
        assert sum(rates) == peak * peak  # the script's NUM_PROMPTS


@given(peaks, models, st.data())
def test_each_second_of_the_ramp_carries_its_rate_evenly_spaced(peak, n, data):
    i = data.draw(st.integers(0, n - 1))
    t = kvcached_ramp_arrivals(peak, i, n)
    t0 = i * kvcached_ramp_delay(peak)
    assert t[0] == t0 and t == sorted(t)
    ramp = t[:min(len(t), sum(kvcached_ramp_rates(peak)))]
    for sec, rate in enumerate(kvcached_ramp_rates(peak)):
        inside = [x for x in ramp if t0 + sec <= x < t0 + sec + 1]
        if not inside:  # PEAK 1: the count runs out inside the schedule
            assert peak == 1
            continue
        assert len(inside) == rate
        assert all(math.isclose(b - a, 1 / rate) for a, b in zip(inside, inside[1:],
                                                                  strict=False))


@given(peaks, models, st.sampled_from(["script", "as_run"]))
def test_the_tail_runs_at_one_request_a_second_after_the_ramp(peak, n, tails):
    d = kvcached_ramp_delay(peak)
    counts = kvcached_ramp_counts(peak, n, tails)
    for i in range(n):
        t = kvcached_ramp_arrivals(peak, i, n, tails)
        assert len(t) == counts[i]
        k = min(len(t), peak * peak) if peak >= 2 else 1
        tail = t[k - 1:]
        assert all(math.isclose(b - a, 1.0) for a, b in zip(tail, tail[1:], strict=False))
        if tails == "script":
            assert counts[i] == peak * peak + (n - i) * d
    if tails == "as_run":  # each count adds to the one before
        assert counts == [peak * peak + sum((n - j) * d for j in range(i + 1)) for i in range(n)]


@given(peaks)
def test_the_stagger_is_the_scripts_integer_delay(peak):
    d = kvcached_ramp_delay(peak)
    assert d == peak // 4 + 2 * peak and isinstance(d, int)
    starts = [kvcached_ramp_arrivals(peak, i, 3)[0] for i in range(3)]
    assert starts == [0, d, 2 * d]


@given(st.integers(1, 10).map(lambda k: 4 * k))
def test_where_the_delay_is_whole_it_matches_the_labs_ramp(peak):
    for i in range(3):
        assert kvcached_ramp_arrivals(peak, i) == ramp_arrivals(peak, i)


@settings(max_examples=10, deadline=None)
@given(st.integers(2, 12), st.integers(0, 2**16))
def test_lengths_and_determinism(peak, seed):
    a = kvcached_ramp_traces(peak, 3, seed=seed)
    b = kvcached_ramp_traces(peak, 3, seed=seed)
    assert [[(r.prompt, r.arrival) for r in m] for m in a] == \
           [[(r.prompt, r.arrival) for r in m] for m in b]
    for i, m in enumerate(a):
        assert [r.arrival for r in m] == kvcached_ramp_arrivals(peak, i, 3)
        assert all(len(r.prompt) == 256 and r.max_new_tokens == 256 for r in m)
        assert all(1 <= x < VOCAB for r in m for x in r.prompt)
        assert {r.group for r in m} == {f"model{i}"} and [r.rid for r in m] == list(range(len(m)))
    other = kvcached_ramp_traces(peak, 3, seed=seed + 1)
    assert [r.arrival for r in other[0]] == [r.arrival for r in a[0]]
    assert other[0][0].prompt != a[0][0].prompt


@pytest.mark.parametrize("args", [(0, 0, 3, "script"), (2.5, 0, 3, "script"),
                                  (True, 0, 3, "script"), (4, 3, 3, "script"),
                                  (4, 0, 0, "script"), (4, 0, 3, "fast")])
def test_bad_input_is_refused_in_one_line(args):
    with pytest.raises(ConfigError) as e:
        kvcached_ramp_arrivals(*args)
    assert "\n" not in str(e.value) and "Fix:" in str(e.value)
