"""dynamic-limit (seed 000 §10): a limit written by the real `kvctl limit` in another process
while traffic runs: revision -> shrink -> convergence, no request killed, misses instead of
crashes, one answer per request id. Checks read the raw samples and the subprocesses' answers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.core.control import read_segment
from workbench.labs.dynamic_limit.lab import DynamicLimitParams
from workbench.labs.dynamic_limit.report import checks, epochs, tables
from workbench.labs.dynamic_limit.sim import run_seed

P = DynamicLimitParams(quick=True)


@pytest.fixture(scope="module")
def run() -> dict:
    return run_seed(P, 0)


def _by_action(run: dict) -> dict[str, dict]:
    return {q["action"]: q for q in run["requests"]}


def test_each_request_is_answered_by_its_own_id(run):
    q = _by_action(run)
    assert len({x["request_id"] for x in run["requests"]}) == len(run["requests"]) == 5
    assert [x["revision"] for x in run["requests"]] == [1, 2, 3, 4, 5]
    assert q["tighten"]["answer"] == "acknowledged" and q["tighten"]["exit"] == 0
    assert q["race: first"]["answer"] == "superseded" and q["race: first"]["exit"] == 3
    assert q["race: first"]["superseded_by"]["request_id"] == q["race: second"]["request_id"]
    assert q["race: second"]["answer"] == "acknowledged"
    # the owner's own set_limit took revision 4 first: the remote request with it is refused
    assert run["in_process_limit"]["revision"] == q["conflict: remote"]["revision"] == 4
    assert (q["conflict: remote"]["answer"], q["conflict: remote"]["outcome"]) == \
        ("refused", "conflict") and q["conflict: remote"]["exit"] == 4
    assert q["release"]["answer"] == "pending" and q["release"]["resolved"] == "acknowledged"


def test_limit_in_force_follows_the_applied_requests(run):
    s = run["samples"]
    in_force = {x["revision"]: x["limit"] for x in s}
    q = _by_action(run)
    assert in_force[1] == q["tighten"]["requested"]
    assert 2 not in in_force  # superseded before the owner looked: never in force
    assert in_force[3] == q["race: second"]["requested"]
    assert in_force[4] == run["in_process_limit"]["limit"] != q["conflict: remote"]["requested"]
    assert s[-1]["limit"] == run["capacity"] == q["release"]["requested"]


def test_shrink_drains_then_converges_and_stays_under(run):
    s = run["samples"]
    shrinks = [e for e in epochs(run) if e["shrinks"]]
    assert [e["revision"] for e in shrinks] == [1, 3, 4]
    for e in shrinks:
        span = [x for x in s if x["revision"] == e["revision"]]
        draining = [x["mapped"] for x in span if x["t"] < e["converged_t"]]
        assert all(b <= a for a, b in zip(draining, draining[1:], strict=False))  # never grows
        after = [x for x in span if x["t"] >= e["converged_t"]]
        assert after and all(x["mapped"] <= x["limit"] for x in after)  # converged, stays
    assert run["live_unmaps"] == [] and run["unmaps"] > 0


def test_pressure_is_misses_and_preemptions_not_kills(run):
    first = next(x for x in run["samples"] if x["revision"] >= 1)
    before = [x for x in run["samples"] if x["t"] < first["t"]]
    assert before[-1]["misses"] == 0  # no limit, no miss
    assert run["samples"][-1]["misses"] > 0 and run["samples"][-1]["preemptions"] > 0
    assert run["finished"] == run["submitted"] and run["summary"]["rejected"] == 0
    assert not run["segment_left"] and read_segment(run["ipc_name"]) is None
    assert all(checks([run], tables([run])).values())


@given(st.lists(st.integers(0, 20), min_size=2, max_size=30), st.integers(1, 29),
       st.integers(1, 20))
def test_convergence_is_the_first_fitting_sample(mapped, cut, limit):
    cut = min(cut, len(mapped) - 1)
    run = {"seed": 0, "samples": [
        {"t": float(i), "mapped": m, "limit": 100 if i < cut else limit,
         "revision": 0 if i < cut else 1, "shrinking": False} for i, m in enumerate(mapped)]}
    (e,) = epochs(run)
    fit = next((i for i in range(cut, len(mapped)) if mapped[i] <= limit), None)
    assert e["shrinks"] is (mapped[cut - 1] > limit)
    assert e["converged_t"] == (None if fit is None else float(fit))
