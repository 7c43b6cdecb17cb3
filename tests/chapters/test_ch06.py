"""Chapter 06's package code: fault cases on real worker processes, the barrier, cleanup."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.core.coordinator import TransportError, WorkerId
from workbench.errors import ConfigError
from workbench.transport.paths import SOCKET_DIR_ENV
from workbench.viz.transactions import (
    BPP,
    CASES,
    case_explorer,
    case_table,
    close_all,
    leftovers,
    open_group,
    run_case,
    traced_pool,
    worker_backend,
)

W0, W1 = "pp0/w0", "pp0/w1"


@pytest.fixture(scope="module", autouse=True)
def socket_base():
    """A private socket base for this module (short: socket paths stay under 107 bytes)."""
    base = tempfile.mkdtemp(prefix="wb6-")
    old = os.environ.get(SOCKET_DIR_ENV)
    os.environ[SOCKET_DIR_ENV] = os.path.join(base, "s")
    yield Path(base, "s")
    close_all()
    if old is None:
        os.environ.pop(SOCKET_DIR_ENV, None)
    else:
        os.environ[SOCKET_DIR_ENV] = old
    shutil.rmtree(base, ignore_errors=True)


# case -> (page 1 state, pool failed, workers' mapped pages, the red messages' labels)
EXPECTED = {
    "commit": ("free", False, {W0: [0], W1: [0]}, []),
    "prepare fails": ("reserved", False, {W0: [0, 1], W1: [0, 1]}, ["prepare: error (device)"]),
    "prepare reply lost": ("reserved", False, {W0: [0, 1], W1: [0, 1]},
                           ["no reply to prepare"]),
    "commit reply lost": ("free", False, {W0: [0], W1: [0]}, ["no reply to commit"]),
    "map fails": ("free", False, {W0: [0], W1: [0]}, ["map: error (device)"]),
    "quarantine": ("quarantined", False, {W0: [0], W1: [0]}, ["map: error (map_quarantined)"]),
    "map reply lost": ("quarantined", True, {W0: [0], W1: [0, 1]}, ["no reply to map"]),
    "worker killed": ("quarantined", True, {W0: [0], W1: None}, ["no reply to map"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_case_outcomes_on_real_processes(name):
    r = run_case(name, tp=2)
    page, failed, held, red = EXPECTED[name]
    assert r.page == page and bool(r.failed) == failed
    assert {w: None if s is None else s["mapped"] for w, s in r.workers.items()} == held
    assert [m.label for m in r.messages if not m.ok] == red
    assert r.participants == ["coordinator", W0, W1]
    if name == "map reply lost":
        assert r.disagree == ["page 1: held on pp0/w1"]
    elif name == "worker killed":
        assert r.disagree is None
    else:
        assert r.disagree == []
    if name == "quarantine":
        assert r.workers[W1]["quarantined"] == [1]
    assert not leftovers()  # the case's group is gone: processes and socket directory


def test_prepare_reply_lost_aborts_everywhere():
    r = run_case("prepare reply lost", tp=2)
    labels = [(m.src, m.dst, m.label.split(" tx ")[0]) for m in r.messages]
    assert labels == [
        ("coordinator", W0, "PREPARE page 1"), ("coordinator", W1, "PREPARE page 1"),
        (W0, "coordinator", "prepare: prepared"), (W1, "coordinator", "no reply to prepare"),
        ("coordinator", W0, "ABORT"), ("coordinator", W1, "ABORT"),
        (W0, "coordinator", "abort: aborted"), (W1, "coordinator", "abort: aborted")]
    assert len({m.label.split(" tx ")[1] for m in r.messages if " tx " in m.label}) == 1


@settings(max_examples=6, deadline=None)
@given(name=st.sampled_from(list(CASES)), tp=st.integers(1, 3))
def test_no_case_leaves_a_page_split_silently(name, tp):
    """Whatever the fault and TP size: the workers agree with the coordinator, or the pool has
    failed (loudly), and nothing is left running."""
    r = run_case(name, tp=tp)
    assert r.failed or r.disagree == []
    assert r.page in ("free", "reserved", "in_use", "quarantined")
    assert not leftovers()


def test_barrier_releases_only_when_every_worker_confirmed():
    with open_group(tp=2, name="barrier") as g:
        t = traced_pool(g, defer_release=True)
        ids = t.kv.alloc(BPP)
        t.kv.free(ids)
        assert t.kv.pages.state[1].value == "retired"
        assert {w: s["mapped"] for w, s in t.workers().items()} == {W0: [0, 1], W1: [0, 1]}
        marker = t.kv.capture_marker()
        g.inject(WorkerId(0, 1), stall="barrier", seconds=2.0)
        t.fan.timeout = 1.0  # rank 0 answers well within it, rank 1 only after 2 s
        assert t.fan.release_retired_through(t.kv, marker) == 0
        assert t.kv.pages.state[1].value == "retired"
        t.fan.timeout = 10.0
        assert t.fan.release_retired_through(t.kv, marker) == 1
        assert t.kv.pages.state[1].value == "free"
        causes = [(e.src, e.dst) for e in t.rec.events if e.page in (1, -1)]
        assert causes == [("free", "in_use"), ("in_use", "retired"),
                          ("barrier@0", "incomplete"), ("retired", "free")]
        red = [m.label for m in t.messages() if not m.ok]
        assert red == ["no reply to barrier"]
    assert not leftovers()


def test_pp_namespace_and_missing_stage():
    with open_group(tp=2, pp=2, name="pp") as g:
        assert {str(t): str(p.relative_to(g.dir)) for t, p in g.paths.items()} == {
            "pp0/w0": "w0.sock", "pp0/w1": "w1.sock", "pp1/w0": "pp1/w0.sock",
            "pp1/w1": "pp1/w1.sock"}
        t = traced_pool(g)
        t.kv.alloc(BPP)
        assert sorted(m.dst for m in t.messages() if m.src == "coordinator") == [
            "pp0/w0", "pp0/w1", "pp1/w0", "pp1/w1"]
    with open_group(tp=1, pp=2, name="nostage", missing=(WorkerId(1, 0),)) as g:
        with pytest.raises(TransportError, match="nothing was sent"):
            traced_pool(g)


def test_close_all_and_leftovers_see_an_open_group():
    g = open_group(tp=1, name="stray")
    left = leftovers()
    assert len(left.dirs) == 1 and left.dirs[0].startswith("stray-") and len(left.processes) == 1
    assert close_all() == 1 and not leftovers() and not g.dir.exists()
    assert close_all() == 0


def test_errors_and_text():
    with pytest.raises(ConfigError, match="use one of commit, prepare fails"):
        run_case("meteor strike")
    with pytest.raises(ConfigError):
        worker_backend("tpu")
    assert worker_backend("sim") == "sim"
    rows = case_table([run_case("commit"), run_case("map reply lost")]).splitlines()
    assert rows[1].split()[:4] == ["commit", "free", "ok", "agree"]
    assert rows[2].startswith("map reply lost      quarantined  FAILED  differ: page 1")


def test_case_explorer_switches_cases():
    pytest.importorskip("ipywidgets")
    results = [run_case("commit"), run_case("map fails")]
    box = case_explorer(results, live=True)
    (pick, upto), fig = box.children[0].children, box.children[1]
    assert upto.max == 8 and fig.layout.title.text.startswith("commit: none")
    pick.value = "map fails"
    assert upto.max == upto.value == 6
    assert fig.layout.title.text.startswith("map fails: rank 1's create fails → page 1 free")
    upto.value = 2
    assert len([a for a in fig.layout.annotations if a.showarrow]) == 2


def test_killed_coordinator_workers_leave_and_gc_collects(socket_base):
    from workbench.viz.transactions import killed_coordinator

    r = killed_coordinator()
    assert r.sockets_before == 2
    assert r.removed == [r.dir] and not Path(r.dir).exists()
    assert r.seconds_to_exit < 60
    assert list(socket_base.iterdir()) == []
