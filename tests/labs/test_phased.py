"""The phase generator the phase labs share (:func:`workbench.engines.sim.workloads.phased`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.engines.sim.workloads import Phase, phased

phase = st.builds(Phase, name=st.sampled_from(["idle", "short", "long"]),
                  duration_s=st.floats(0.5, 20.0), rate=st.sampled_from([0.0, 0.5, 3.0, 8.0]),
                  prompt_len=st.integers(1, 64), output_len=st.integers(1, 8),
                  prompt_key=st.sampled_from([None, 1, 2]))


@settings(max_examples=60, deadline=None)
@given(st.lists(phase, min_size=1, max_size=6), st.integers(0, 3))
def test_windows_tile_time_and_hold_their_requests(phases, seed):
    reqs, windows = phased(phases, seed=seed, group_prefix="g-")
    assert windows[0].start == 0.0
    for a, b in zip(windows, windows[1:], strict=False):
        assert b.start == a.end
    assert [w.end - w.start for w in windows] == pytest.approx([p.duration_s for p in phases])
    assert sum(w.requests for w in windows) == len(reqs)
    assert [r.rid for r in reqs] == list(range(len(reqs)))
    i = 0
    for w, p in zip(windows, phases, strict=True):
        mine = reqs[i:i + w.requests]
        i += w.requests
        if p.rate == 0:
            assert not mine
        for r in mine:  # inside the window, the phase's shape, labelled by it
            assert w.start <= r.arrival < w.end
            assert r.prompt_len == p.prompt_len and r.max_new_tokens == p.output_len
            assert r.group == "g-" + p.name
    assert reqs == sorted(reqs, key=lambda r: r.arrival)
    assert phased(phases, seed=seed, group_prefix="g-")[1] == windows  # deterministic


@settings(max_examples=30, deadline=None)
@given(st.floats(1.0, 10.0), st.sampled_from([1.0, 4.0]), st.integers(0, 5))
def test_a_repeated_phase_repeats_its_traffic(duration, rate, seed):
    first = Phase("first", duration, rate, 32, 4, prompt_key=5)
    gap = Phase("idle", 3.0)
    again = first._replace(name="again")
    reqs, w = phased([first, gap, again], seed=seed)
    a = [r for r in reqs if r.group == "first"]
    b = [r for r in reqs if r.group == "again"]
    assert len(a) == len(b) == w[0].requests
    for x, y in zip(a, b, strict=True):
        assert y.prompt == x.prompt
        assert abs((y.arrival - w[2].start) - (x.arrival - w[0].start)) < 1e-9
    fresh = phased([first._replace(prompt_key=None), gap,
                    again._replace(prompt_key=None)], seed=seed)[0]
    fa = [r.prompt for r in fresh if r.group == "first"]
    fb = [r.prompt for r in fresh if r.group == "again"]
    assert not set(map(tuple, fa)) & set(map(tuple, fb))  # fresh prompts share nothing
