"""The control plane across real processes: a pool owner, ``workbench kvctl`` and ``kvtop``."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.pool_owner import spawn_owner
from workbench.core import control
from workbench.errors import ConfigError
from workbench.names import NAME_MAX, check_name, is_valid_name
from workbench.procs import pid_alive, proc_start_time


def cli(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True,
                          text=True, timeout=60, check=check)


@pytest.fixture
def owner():
    name = f"t_{uuid.uuid4().hex[:10]}"
    p = spawn_owner(name)
    assert p.stdout.readline().strip() == "ready"

    def say(cmd: str) -> str:
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        return p.stdout.readline().strip()

    yield name, p, say
    if p.poll() is None:
        say("quit")
        p.wait(timeout=30)
    control.segment_path(name).unlink(missing_ok=True)


def test_segment_is_private_and_listed(owner):
    name, p, _ = owner
    path = control.segment_path(name)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    rows = json.loads(cli("kvctl", "list", "--json", check=True).stdout)
    row = next(r for r in rows if r["name"] == name)
    assert row["owner_pid"] == p.pid and row["alive"]
    assert row["owner_start"] == proc_start_time(p.pid) > 0  # liveness is pid and start time
    assert row["used"] == 5 * 8 << 20


def test_limit_from_a_third_process_takes_effect_in_the_owner(owner):
    name, _, say = owner
    r = cli("kvctl", "limit", name, "24MiB", "--json", "--wait", "0")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["outcome"] == "pending"  # the owner has not polled yet
    assert say("poll") == "polled"
    info = control.read_segment(name)
    assert info.ack_revision == info.req_revision == info.revision
    assert info.limit == 24 << 20 and info.outcome == "deferred"  # 5 pages live, limit 3
    assert say("free") == "freed"
    info = control.read_segment(name)
    assert info.outcome == "applied" and info.mapped <= 24 << 20
    assert info.page_states[3:] == ["reclaimed"] * 7
    # and a percentage, answered while the owner polls
    r = cli("kvctl", "limit-percent", name, "50", "--json", "--wait", "0")
    assert say("poll") == "polled"
    assert control.read_segment(name).limit == 40 << 20


@pytest.mark.parametrize("args, words", [
    (("limit", "{name}", "8X"), "not a size"),
    (("limit", "{name}", "--", "-1"), "negative"),
    (("limit", "{name}", "-1"), "No such option"),
    (("limit", "{name}", "1G"), "exceeds"),
    (("limit", "{name}", "1MiB"), "below one page"),
    (("limit", "nosuchpool", "8M"), "no pool named"),
    (("limit", "../etc", "8M"), "path separators"),
    (("limit-percent", "{name}", "150"), "between 0 and 100"),
    (("delete", "{name}"), "live process"),
])
def test_bad_requests_fail_clearly_and_write_nothing(owner, args, words):
    name, _, _ = owner
    before = control.read_segment(name)
    r = cli("kvctl", *(a.format(name=name) for a in args))
    assert r.returncode == 2
    assert words in r.stderr
    after = control.read_segment(name)
    assert (after.req_revision, after.req_limit, after.limit) == (
        before.req_revision, before.req_limit, before.limit)


def test_gc_removes_segments_of_killed_owners(owner):
    name, p, _ = owner
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert control.read_segment(name) is not None  # SIGKILL left it behind
    assert not control.read_segment(name).alive
    r = cli("kvctl", "gc", "--json", check=True)
    assert name in json.loads(r.stdout)["segments"]
    assert control.read_segment(name) is None


def test_clean_close_removes_the_segment(owner):
    name, _, say = owner
    assert say("quit") == "closed"
    assert control.read_segment(name) is None


def test_kvtop_draws_pools(owner):
    name, _, _ = owner
    r = cli("kvtop", "--once", "--width", "32", check=True)
    assert name in r.stdout and "█" in r.stdout
    data = json.loads(cli("kvtop", "--json", check=True).stdout)
    mine = next(d for d in data if d["name"] == name)
    assert mine["page_states"][:5] == ["in_use"] * 5


def test_watch_prints_samples(owner):
    name, _, _ = owner
    r = cli("kvctl", "watch", name, "--count", "2", "--interval", "0.05", "--json", check=True)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 2 and lines[0]["name"] == name


def test_watch_ends_after_its_duration(owner):
    name, _, _ = owner
    r = cli("kvctl", "watch", name, "--duration", "0.3", "--interval", "0.1", "--json",
            check=True)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert 2 <= len(lines) <= 4 and {x["name"] for x in lines} == {name}


def test_a_killed_owner_is_dead_even_if_its_pid_comes_back(owner):
    name, p, _ = owner
    info = control.read_segment(name)
    assert pid_alive(p.pid, info.owner_start)
    assert not pid_alive(p.pid, info.owner_start + 1)  # same pid, another process: not the owner
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert not pid_alive(p.pid, info.owner_start) and not control.read_segment(name).alive


@pytest.mark.parametrize("pid", [0, -1, 1 << 31, 1 << 63, -(1 << 63), "1", None, True, 1.0])
def test_garbage_pids_are_not_alive_and_never_raise(pid):
    assert pid_alive(pid) is False and pid_alive(pid, 5) is False
    assert proc_start_time(pid) is None


def test_liveness_checks_the_start_time():
    me = os.getpid()
    assert pid_alive(me) and pid_alive(me, proc_start_time(me))
    assert not pid_alive(me, proc_start_time(me) + 1)


_NAME_CHARS = "abcXYZ019_-."


@given(st.text(alphabet=_NAME_CHARS + "/\\\n\t\x00 é\x7f", max_size=NAME_MAX + 3))
def test_names_are_checked_by_one_rule(name):
    ok = 1 <= len(name) <= NAME_MAX and set(name) <= set(_NAME_CHARS) and set(name) != {"."}
    assert is_valid_name(name) is ok
    if ok:
        assert check_name(name) == name and control.segment_path(name).name == "wbkv_" + name
    else:
        with pytest.raises(ConfigError, match="IPC name"):
            control.segment_path(name)


@pytest.mark.parametrize("name", ["pool\n", "pool\r", "\npool", "po ol", "pool/", "."])
def test_a_trailing_newline_or_separator_is_refused(name):
    assert not is_valid_name(name)
    with pytest.raises(ConfigError, match="IPC name"):
        check_name(name)


def test_a_live_name_cannot_be_taken(owner):
    name, _, _ = owner
    from workbench.config import PoolConfig
    from workbench.core.geometry import KVGeometry
    from workbench.core.ledger import KVCacheManager
    from workbench.sim.device import SimDevice

    with pytest.raises(ConfigError, match="in use by live process"):
        KVCacheManager(KVGeometry(num_layers=2, kv_heads=8, head_dim=128), SimDevice(),
                       config=PoolConfig(ipc_name=name))


def test_every_command_has_help():
    for args in ([], ["kvctl"], ["kvctl", "list"], ["kvctl", "limit"], ["kvctl", "gc"],
                 ["kvctl", "watch"], ["kvctl", "delete"], ["kvctl", "limit-percent"],
                 ["kvtop"], ["replay"], ["lab"]):
        r = cli(*args, "--help")
        assert r.returncode == 0 and "Usage" in r.stdout, (args, r.stderr)
