"""A dead owner is dead even before its parent reaps it: a SIGKILLed child left a zombie (this
test process never waits for it until the end) gives back its GPU-budget bytes and its
segment, ``kvctl limit`` refuses it, and half-written budget files of dead creators are
collected. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
import pytest

from tests.pool_owner import spawn_owner
from workbench.core import budget_segment as bs
from workbench.core import control, segment
from workbench.procs import pid_alive, proc_start_time

MiB = 1 << 20


def zombie(proc: subprocess.Popen) -> subprocess.Popen:
    """SIGKILL ``proc`` and leave it unreaped; returns once the kernel shows it a zombie."""
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the killed child never became a zombie"
        time.sleep(0.01)
    return proc


@pytest.fixture
def children():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def test_a_zombie_is_not_alive_and_a_stopped_process_is(children):
    p = subprocess.Popen(["sleep", "600"])
    children.append(p)
    start = proc_start_time(p.pid)
    os.kill(p.pid, signal.SIGSTOP)  # stopped is still running: it resumes and owns its memory
    assert pid_alive(p.pid) and pid_alive(p.pid, start)
    zombie(p)
    assert psutil.pid_exists(p.pid)  # still in the process table ...
    assert not pid_alive(p.pid) and not pid_alive(p.pid, start)  # ... but not running


HOLDER = textwrap.dedent("""
    import sys
    from workbench.core import budget_segment as bs
    b = bs.SharedBudget.open("gpu-z", int(sys.argv[2]), shm_dir=sys.argv[1])
    assert b.charge(int(sys.argv[2]))
    print("held", flush=True)
    sys.stdin.readline()
""")


def test_a_killed_unreaped_holders_bytes_go_to_the_next_charge(tmp_path, children):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), str(64 * MiB)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    children.append(p)
    assert p.stdout.readline().strip() == "held"
    mine = bs.SharedBudget.open("gpu-z", None, shm_dir=tmp_path)
    assert not mine.charge(MiB)  # the live holder has it all
    zombie(p)
    state = mine.state()
    assert [h.alive for h in state.holders.values()] == [False]
    assert mine.totals() == (64 * MiB, 0)  # the headroom shows ...
    assert mine.charge(64 * MiB)  # ... and the charge reclaims the zombie's slot to take it
    assert mine.reclaimed == 64 * MiB
    mine.close()


def test_a_killed_unreaped_owners_segment_is_gone_to_list_gc_and_limit(children):
    name = f"zomb{uuid.uuid4().hex[:8]}"
    p = spawn_owner(name)
    children.append(p)
    assert p.stdout.readline().strip() == "ready"
    assert control.read_segment(name).alive
    zombie(p)
    info = control.read_segment(name)
    assert not info.alive
    r = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "limit", name, "16MiB"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "is gone" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert control.gc_segments(only=name) == [name]
    assert not segment.segment_path(name).exists()


def test_half_written_budgets_of_dead_creators_are_collected_and_others_kept(tmp_path,
                                                                              children):
    p = subprocess.Popen(["sleep", "600"])
    children.append(p)
    start = proc_start_time(p.pid)
    zombie(p)
    me, my_start = os.getpid(), proc_start_time(os.getpid())
    files = {
        "dead_magic": (f"{bs.PARTIAL_PREFIX}{p.pid}_{start}_ab12_gpu0", bs.MAGIC + bytes(40)),
        "dead_empty": (f"{bs.PARTIAL_PREFIX}{p.pid}_{start}_cd34_gpu1", b""),
        "dead_foreign": (f"{bs.PARTIAL_PREFIX}{p.pid}_{start}_ef56_gpu2", b"not ours"),
        "live": (f"{bs.PARTIAL_PREFIX}{me}_{my_start}_0a0b_gpu3", bs.MAGIC),
        "unparsable": (f"{bs.PARTIAL_PREFIX}x_y_z_gpu4", bs.MAGIC),
    }
    for entry, data in files.values():
        (tmp_path / entry).write_bytes(data)
    target = tmp_path / "elsewhere"
    target.write_bytes(bs.MAGIC)
    link = f"{bs.PARTIAL_PREFIX}{p.pid}_{start}_9999_gpu5"
    (tmp_path / link).symlink_to(target)
    assert bs.gc_partials(tmp_path) == sorted([files["dead_magic"][0], files["dead_empty"][0]])
    left = set(os.listdir(tmp_path))
    assert {files[k][0] for k in ("dead_foreign", "live", "unparsable")} | {link} <= left
    assert target.read_bytes() == bs.MAGIC
    # creating a budget collects them too
    (tmp_path / files["dead_magic"][0]).write_bytes(bs.MAGIC)
    bs.SharedBudget.open("gpu9", MiB, shm_dir=tmp_path).close()
    assert files["dead_magic"][0] not in os.listdir(tmp_path)
