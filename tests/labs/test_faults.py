"""faults (seed 000 §12): each injected fault is undone at its protocol step, the pool goes on
or fails loudly, and nothing leaks. Checked from the workers' own state and the coordinator's
message log, on simulated workers and on real worker processes (host memory, real SIGKILL)."""

from __future__ import annotations

import copy
import json

import pytest

from tests.labs.cli import run_lab_cli
from workbench.labs import run_lab
from workbench.labs.faults.lab import FaultsParams, run_order
from workbench.labs.faults.real import CASES, coordinator_killed, run_case
from workbench.labs.faults.report import case_checks
from workbench.labs.kit.tp_pp_workers import GEO, open_rig

pytestmark = pytest.mark.usefixtures("socket_base")

BACKENDS = ["sim", "host"]
PAGE = GEO.page_id_bytes
ONE = {"pp0/tp0": PAGE, "pp0/tp1": PAGE}  # page 0 (the null block's) on each rank
TWO = {"pp0/tp0": 2 * PAGE, "pp0/tp1": 2 * PAGE}


def _labels(r: dict) -> list[tuple[str, str, str]]:
    return [(m.src, m.dst, m.label.split(" tx ")[0]) for m in r["messages"]]


def _no_leak(r: dict) -> None:
    assert r["after_shutdown"] == {"socket_dir_left": False, "workers_left": []}
    assert r["shm_left"] == []
    for snap in ("start", "before", "after", "end"):
        assert all(v in (0, None) for v in r[snap]["unbacked"].values()), snap


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_failure_is_rolled_back_on_the_other_rank(backend):
    r = run_case(backend, "map-failure")
    assert r["result"] == "refused (None)"
    assert r["before"]["held"] == r["after"]["held"] == TWO
    assert r["after"]["mapped"] == {"pp0/tp0": [0, 1], "pp0/tp1": [0, 1]}
    assert _labels(r) == [("coordinator", "pp0/w0", "MAP page 2"),
                          ("coordinator", "pp0/w1", "MAP page 2"),
                          ("pp0/w0", "coordinator", "map: ok"),
                          ("pp0/w1", "coordinator", "map: error (device)"),
                          ("coordinator", "pp0/w0", "UNMAP page 2"),
                          ("pp0/w0", "coordinator", "unmap: ok")]
    assert r["cleaned_up"] == ["coordinator -> pp0/w0: UNMAP page 2"]
    assert not r["after"]["pool_failed"] and r["end"]["held"] == r["start"]["held"] == ONE
    _no_leak(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prepare_failure_aborts_everywhere_and_keeps_the_page(backend):
    r = run_case(backend, "prepare-failure")
    assert r["after"]["page1"] == "reserved" and r["after"]["held"] == r["before"]["held"] == TWO
    assert r["after"]["retained"] == {"pp0/tp0": [], "pp0/tp1": []}
    aborts = [d for s, d, lab in _labels(r) if lab == "ABORT"]
    assert aborts == ["pp0/w0", "pp0/w1"]  # also the rank whose prepare failed
    assert r["end"]["held"] == ONE and r["end"]["page1"] == "free"
    _no_leak(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lost_commit_reply_is_retried_on_that_rank_only(backend):
    r = run_case(backend, "lost-commit-reply")
    commits = [d for s, d, lab in _labels(r) if lab == "COMMIT"]
    assert commits == ["pp0/w0", "pp0/w1", "pp0/w1"]
    assert ("pp0/w1", "coordinator", "no reply to commit") in _labels(r)
    assert r["after"]["page1"] == "free" and r["after"]["held"] == ONE
    assert not r["after"]["pool_failed"]
    _no_leak(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_worker_fails_the_pool_and_nothing_else(backend):
    r = run_case(backend, "killed-process")
    assert r["result"] == "StateConsistencyError" and "outcome unknown" in r["after"][
        "pool_failed"]
    assert r["after"]["held"] == {"pp0/tp0": 2 * PAGE, "pp0/tp1": None}  # page 2 undone
    assert r["after"]["mapped"]["pp0/tp0"] == [0, 1] and r["after"]["page2"] == "quarantined"
    assert r["cleaned_up"] == ["coordinator -> pp0/w0: UNMAP page 2"]
    assert r["other_instance_ok"] is True
    if backend == "host":
        assert r["victim_exit_code"] == -9 and r["victim_socket_left"] is True
        assert r["pool_cleanup"].endswith("removed the socket file SIGKILL left")
    _no_leak(r)


def test_the_leak_check_sees_a_retained_handle():
    """A prepared but uncommitted unmap holds memory with no mapping: ``unbacked`` shows it."""
    rig = open_rig("sim", 2, 1)
    fan = rig.space()
    fan.map_page(3)
    fan.prepare_unmap(3)
    held, mapped = rig.held(), rig.mapped()
    assert mapped == {"pp0/tp0": [], "pp0/tp1": []} and held == {"pp0/tp0": PAGE,
                                                                  "pp0/tp1": PAGE}
    fan.commit_unmap(3)
    assert rig.held() == {"pp0/tp0": 0, "pp0/tp1": 0}


def test_checks_are_not_vacuous():
    r = run_case("sim", "map-failure")
    assert all(case_checks(r, real=False).values())
    leaked = copy.deepcopy(r)
    leaked["after"]["held"]["pp0/tp0"] += PAGE
    stale = copy.deepcopy(r)
    stale["after_shutdown"]["socket_dir_left"] = True
    unbacked = copy.deepcopy(r)
    unbacked["end"]["unbacked"]["pp0/tp1"] = PAGE
    assert not case_checks(leaked, real=False)["rolled_back"]
    assert not case_checks(stale, real=False)["nothing_left"]
    assert not case_checks(unbacked, real=False)["no_unbacked_bytes"]


def test_case_order_alternates():
    assert run_order(CASES, 2) == [(c, 0) for c in CASES] + [(c, 1) for c in CASES[::-1]]


def test_killed_coordinator_is_collected_by_gc():
    kc = coordinator_killed("host")
    assert kc == {"dir_after_kill": True, "workers_left_sockets": 0, "dir_before_gc": True,
                  "gc_removed_it": True, "dir_after_gc": False}


def test_lab_record_and_cli(tmp_path):
    res = run_lab("faults", FaultsParams(quick=True), "sim")
    d = json.loads(res.record.to_json())
    assert d["verdict"] == "supported" and d["samples"]["order"] == [f"{c}/0" for c in CASES]
    assert set(res.tables["checks"][0]) >= {"all_or_none", "nothing_left", "case"}
    assert d["results"]["messages"]["lost-commit-reply"][-1]["label"] == "commit: committed"
    assert "| case | expected | measured |" in res.markdown
    assert run_lab_cli(tmp_path / "f.json", "faults", "--quick")["verdict"] == "supported"
