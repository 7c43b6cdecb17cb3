"""no-fake-enable (seed 000 §5): the evidence that elastic KV is on must come from the memory and
the control plane, and must disappear when it is silently off. Each check reads the raw samples,
the real `doctor` / `kvctl list` answers and the pool, not the lab's verdict."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.core.control import read_segment
from workbench.labs import run_lab
from workbench.labs.no_fake_enable.lab import NoFakeEnableParams
from workbench.labs.no_fake_enable.report import EXPECTED_FAIL, matches, tables
from workbench.labs.no_fake_enable.sim import ARMS, AUTOPATCH, IDLE_S, SPLIT_GIB, judge, run_all
from workbench.units import GiB

P = NoFakeEnableParams(quick=True)


@pytest.fixture(scope="module")
def out() -> dict:
    return run_all(P)


def _run(out: dict, arm: str) -> dict:
    return next(r for r in out["runs"] if r["arm"] == arm)


def test_every_arm_serves_alike(out):
    """A ready, serving engine is no evidence: every arm finishes every request."""
    for r in out["runs"]:
        assert r["summary"]["finished"] == r["requests"] == 24


def test_elastic_memory_follows_load_static_does_not(out):
    for arm in ("enabled", "no-ipc-name"):
        r = _run(out, arm)
        idle = [kv for t, kv, _ in r["samples"] if t < IDLE_S]
        busy = [kv for _, kv, n in r["samples"] if n]
        tail = r["samples"][-1][1]
        assert max(busy) >= max(idle) + r["page_id_bytes"]
        assert tail < max(busy)  # and gives pages back once idle
    for arm in ("autopatch-off", "patch-not-applied"):
        r = _run(out, arm)
        assert {kv for _, kv, _ in r["samples"]} == {int(SPLIT_GIB * GiB)}  # flat: the split


def test_doctor_reads_the_switch_from_the_environment(out):
    for arm, cfg in out["doctor"].items():
        assert cfg["autopatch_enabled"] is (AUTOPATCH in out["arms"][arm])
        assert cfg["config_error"] is None


def test_segment_seen_from_another_process_is_the_pools_state(out):
    r = _run(out, "enabled")
    seg = [s for s in r["segments"] if s["name"] == r["ipc_name"]]
    assert len(seg) == 1 and seg[0]["owner_pid"] == r["pid"] and seg[0]["alive"]
    assert seg[0]["mapped"] == r["mid"]["pool_mapped"] > 0
    assert seg[0]["used_blocks"] == r["mid"]["pool_used_blocks"] > 0
    for arm in ("autopatch-off", "patch-not-applied", "no-ipc-name"):
        assert not [s for s in _run(out, arm)["segments"] if s["owner_pid"] == r["pid"]]
    assert read_segment(r["ipc_name"]) is None  # closed pools leave no segment behind


def test_each_arm_fails_exactly_the_checks_its_missing_piece_explains(out):
    for r in out["runs"]:
        failed = {c for c, v in r["checks"].items() if not v["ok"]}
        assert failed == set(EXPECTED_FAIL[r["arm"]]), r["arm"]
    assert matches(tables(out))


def test_a_stale_segment_fails_the_control_check(out):
    r = copy.deepcopy(_run(out, "enabled"))
    doc = {"config": out["doctor"]["enabled"]}
    assert judge(r, doc)["control segment"]["ok"]
    mine = next(s for s in r["segments"] if s["name"] == r["ipc_name"])
    mine["mapped"] += r["page_id_bytes"]  # a segment that does not say what the pool holds
    assert not judge(r, doc)["control segment"]["ok"]


@given(st.integers(0, 40), st.integers(0, 40))
def test_growth_check_needs_one_whole_page(idle_pages, peak_pages):
    page = 1 << 27
    r = {"samples": [(0.0, idle_pages * page, 0), (IDLE_S + 1, peak_pages * page, 3)],
         "page_id_bytes": page, "segments": [], "pid": 1, "ipc_name": None,
         "mid": {"pool_mapped": 0, "pool_used_blocks": 0}, "mode": "elastic",
         "summary": {"finished": 1}, "requests": 1}
    doc = {"config": {"autopatch_enabled": True, "config_error": None, "pth_installed": False}}
    assert judge(r, doc)["mapped grows with load"]["ok"] is (peak_pages >= idle_pages + 1)


def test_lab_on_another_seed_supports_the_claim():
    res = run_lab("no-fake-enable", NoFakeEnableParams(quick=True, seed=1))
    assert res.record.verdict.startswith("Supported")
    assert [r["arm"] for r in res.tables["latency"]] == list(ARMS)
    assert len(res.tables["checks"]) == len(ARMS) * 5
    assert all(r["verdict"] == r["expected"] for r in res.tables["checks"])
