"""Hostile entries in the socket base directory: `gc_sockets` (and `workbench kvctl gc`) removes
only directories that are provably ours and dead, skips everything else with one line, never
hangs on a FIFO owner file, and still cleans up after a SIGKILLed owner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench.procs import my_identity
from workbench.transport.paths import OWNER_FILE, PARTIAL, SOCKET_DIR_ENV, gc_sockets

ROOT = Path(__file__).parents[2]
ME, MY_START = my_identity()


@pytest.fixture
def base(tmp_path, monkeypatch):
    b = tmp_path / "s"
    b.mkdir(mode=0o700)
    monkeypatch.setenv(SOCKET_DIR_ENV, str(b))
    return b


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def owned(base: Path, name: str, owner: object) -> Path:
    d = base / name
    d.mkdir(mode=0o700)
    (d / OWNER_FILE).write_text(owner if isinstance(owner, str) else json.dumps(owner))
    return d


def plant_all(base: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """(removable, kept): the directories gc must remove, and the entries it must keep with the
    words of their one line."""
    removable = {
        "dead": owned(base, "dead-1", {"pid": dead_pid(), "start": 5}),
        "reused": owned(base, "reused-1", {"pid": ME, "start": MY_START + 9}),
        "crashed": base / f"{PARTIAL}{dead_pid()}-7-abcdef",
    }
    removable["crashed"].mkdir()
    kept = {
        owned(base, "live-1", {"pid": ME, "start": MY_START}): None,
        owned(base, "garbage-1", "{not json"): "is not JSON",
        owned(base, "deep-1", "[" * 4000): "is not JSON",
        owned(base, "pid31-1", {"pid": 1 << 31}): "does not name a valid pid",
        owned(base, "pid63-1", {"pid": 1 << 63, "start": 1}): "does not name a valid pid",
        owned(base, "neg-1", {"pid": -3}): "does not name a valid pid",
        owned(base, "str-1", {"pid": str(ME)}): "does not name a valid pid",
        owned(base, "bool-1", {"pid": True}): "does not name a valid pid",
        owned(base, "start-1", {"pid": ME, "start": "x"}): "does not name a valid pid",
    }
    (base / "noowner-1").mkdir()
    kept[base / "noowner-1"] = f"no readable {OWNER_FILE}"
    (base / "fifo-1").mkdir()
    os.mkfifo(base / "fifo-1" / OWNER_FILE)
    kept[base / "fifo-1"] = "not a small regular file"
    (base / "link-1").mkdir()
    (base / "link-1" / OWNER_FILE).symlink_to(base / "dead-1" / OWNER_FILE)
    kept[base / "link-1"] = f"no readable {OWNER_FILE}"
    (base / "tolink").symlink_to(base / "dead-1")
    kept[base / "tolink"] = "not a directory"
    os.mkfifo(base / "afifo")
    kept[base / "afifo"] = "not a directory"
    (base / f"{PARTIAL}junk").mkdir()
    kept[base / f"{PARTIAL}junk"] = "not by a workbench"
    return removable, {str(p): w for p, w in kept.items()}


def test_gc_removes_only_what_is_ours_and_dead(base):
    removable, kept = plant_all(base)
    report: list[str] = []
    assert sorted(gc_sockets(report=report)) == sorted(str(p) for p in removable.values())
    assert not any(p.exists() for p in removable.values())
    assert all(os.path.lexists(p) for p in kept)
    expected = {p: w for p, w in kept.items() if w is not None}
    assert len(report) == len(expected)
    for path, words in expected.items():
        mine = [ln for ln in report if ln.startswith(f"skipped {path}:")]
        assert len(mine) == 1 and words in mine[0] and "\n" not in mine[0], (path, report)


def test_kvctl_gc_reports_and_keeps_the_rest(base):
    removable, kept = plant_all(base)
    r = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "gc", "--json", "--verbose"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, SOCKET_DIR_ENV: str(base)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    out = json.loads(r.stdout)
    assert sorted(out["socket_dirs"]) == sorted(str(p) for p in removable.values())
    for path, words in kept.items():
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith(f"skipped {path}:")]
        assert len(lines) == (0 if words is None else 1), (path, r.stderr)
    assert all(os.path.lexists(p) for p in kept)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_another_users_directory_is_never_collected(base):
    d = owned(base, "foreign-1", {"pid": dead_pid(), "start": 1})
    os.chown(d, 65534, 65534)
    report: list[str] = []
    assert gc_sockets(report=report) == []
    assert report == [f"skipped {d}: owned by uid 65534, not by this user"] and d.exists()


def test_gc_after_sigkill_still_collects(base):
    script = textwrap.dedent("""
        import sys, time
        from workbench.transport.paths import make_pool_dir, socket_path
        from workbench.core.coordinator import WorkerId
        d = make_pool_dir(sys.argv[1])
        socket_path(d, WorkerId(pp=1, tp=0)).touch()  # a PP namespace with a socket file in it
        print(d, flush=True)
        time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", script, "doomed"], stdout=subprocess.PIPE,
                         text=True, cwd=ROOT)
    doomed = Path(p.stdout.readline().strip())
    assert gc_sockets() == [] and doomed.is_dir()  # alive: left alone
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert gc_sockets() == [str(doomed)] and not doomed.exists()


def test_an_owner_killed_while_making_its_directory_is_collected(base):
    script = textwrap.dedent("""
        import os, signal, sys
        from pathlib import Path
        Path.rename = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # dies before the rename
        from workbench.transport.paths import make_pool_dir
        make_pool_dir("halfway")
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=60)
    assert p.returncode == -signal.SIGKILL
    (left,) = base.iterdir()
    assert left.name.startswith(PARTIAL) and (left / OWNER_FILE).exists()
    assert gc_sockets() == [str(left)] and not left.exists()


def test_a_shared_rendezvous_dir_is_collected_once_its_owner_is_gone(base):
    """A vLLM engine core and its workers meet in ``vllm-engine-<pid>``: owned by the engine
    core, kept while it lives, collected after it died; a second arrival finds the first's."""
    from workbench.adapters.vllm.fanout import rendezvous

    gone = dead_pid()
    live, dead = rendezvous(ME), rendezvous(gone)
    assert rendezvous(ME) == live and live.name == f"vllm-engine-{ME}"
    assert json.loads((live / OWNER_FILE).read_text())["pid"] == ME
    assert gc_sockets() == [str(dead)]
    assert live.is_dir() and not dead.exists()
    assert not list(base.glob(f"{PARTIAL}*"))  # nothing half-made left behind
