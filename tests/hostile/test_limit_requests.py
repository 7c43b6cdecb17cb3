"""Concurrent `workbench kvctl limit` callers, in real processes, against one owner process: each
caller is told what became of *its* request (acknowledged, superseded by which revision and
request, or refused) in its exit status and its one-line answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from workbench.core import control
from workbench.units import MiB

ROOT = Path(__file__).parents[2]
OWNER = textwrap.dedent("""
    import sys, time
    from workbench.config import PoolConfig
    from workbench.core.geometry import KVGeometry
    from workbench.core.ledger import KVCacheManager
    from workbench.sim.device import SimDevice
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, num_blocks=640)  # 10 x 8 MiB
    kv = KVCacheManager(geo, SimDevice(), name=sys.argv[1],
                        config=PoolConfig(ipc_name=sys.argv[1], min_reserved_pages=0,
                                          max_reserved_pages=1))
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "poll":              # what every alloc and free does first
            kv.poll_control()
        elif cmd[0] == "bump":            # two in-process limit changes (revisions move on)
            kv.set_limit(kv.limit_bytes)
            kv.set_limit(kv.limit_bytes)
        elif cmd[0] == "churn":           # an engine's step loop: alloc and free, for a while
            end, step = time.monotonic() + float(cmd[1]), float(cmd[2])
            while time.monotonic() < end:
                ids = kv.alloc(64)
                if ids:
                    kv.free(ids)
                time.sleep(step)
        elif cmd[0] == "quit":
            break
        print(f"{kv.limit_bytes} {kv.revision}", flush=True)
    kv.close()
""")


@pytest.fixture
def owner():
    name = f"hl_{uuid.uuid4().hex[:10]}"
    p = subprocess.Popen([sys.executable, "-c", OWNER, name], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline().strip() == "ready"

    def say(cmd: str) -> tuple[int, int]:
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        limit, revision = p.stdout.readline().split()
        return int(limit), int(revision)

    yield name, say
    p.stdin.write("quit\n")
    p.stdin.close()
    p.wait(timeout=30)
    assert not control.segment_path(name).exists()


def caller(name: str, size: str, wait: float = 30.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workbench", "kvctl", "limit", name, size,
                             "--json", "--wait", str(wait)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)


def wait_for_request(name: str, revision: int) -> None:
    deadline = time.monotonic() + 60
    while control.read_segment(name).req_revision < revision:
        assert time.monotonic() < deadline, "the caller never wrote its request"
        time.sleep(0.01)


def finish(p: subprocess.Popen) -> tuple[int, dict]:
    out, err = p.communicate(timeout=60)
    assert "Traceback" not in err, err
    return p.returncode, json.loads(out)


def test_a_request_replaced_before_the_owner_polled_is_told_superseded(owner):
    name, say = owner
    a = caller(name, "48MiB")
    wait_for_request(name, 1)
    b = caller(name, "32MiB")
    wait_for_request(name, 2)
    assert say("poll") == (32 * MiB, 2)  # the owner sees only the newest request
    (rc_a, ans_a), (rc_b, ans_b) = finish(a), finish(b)
    assert (rc_b, ans_b["answer"], ans_b["revision"], ans_b["outcome"]) == (
        0, "acknowledged", 2, "applied")
    assert (rc_a, ans_a["answer"], ans_a["revision"]) == (3, "superseded", 1)
    assert ans_a["superseded_by"] == {"revision": 2, "request_id": ans_b["request_id"]}
    assert ans_a["request_id"] != ans_b["request_id"] and ans_a["limit"] == 32 * MiB


def test_the_human_answer_names_the_superseding_request(owner):
    name, say = owner
    a = subprocess.Popen([sys.executable, "-m", "workbench", "kvctl", "limit", name, "48MiB",
                          "--wait", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT)
    wait_for_request(name, 1)
    b = caller(name, "40MiB")
    wait_for_request(name, 2)
    say("poll")
    out, err = a.communicate(timeout=60)
    rc_b, ans_b = finish(b)
    assert a.returncode == 3 and rc_b == 0 and err == ""
    assert out.splitlines() == [
        f"{name}: limit 48.00 MiB (revision 1, request {out.split('request ')[1][:16]}) "
        f"superseded by revision 2 (request {ans_b['request_id']}, applied); the limit in "
        f"force is 40.00 MiB"]


def test_a_request_the_owner_refuses_is_told_refused(owner):
    name, say = owner
    a = caller(name, "24MiB")
    wait_for_request(name, 1)
    assert say("bump")[1] == 2  # the owner moved past revision 1 on its own
    assert say("poll") == (80 * MiB, 2)  # the request is stale: the limit is unchanged
    rc, ans = finish(a)
    assert (rc, ans["answer"], ans["outcome"], ans["revision"]) == (4, "refused", "stale", 1)


def test_a_caller_that_does_not_wait_is_told_pending(owner):
    name, say = owner
    rc, ans = finish(caller(name, "24MiB", wait=0))
    assert (rc, ans["answer"], ans["outcome"], ans["acknowledged"]) == (0, "pending", "pending",
                                                                         False)
    assert say("poll") == (24 * MiB, 1)


@pytest.mark.parametrize("step", [0.002, 0.002, 0.5, 0.5])  # seconds between allocs
def test_two_callers_at_once_against_a_busy_owner(owner, step):
    name, say = owner
    before = control.read_segment(name).req_revision
    callers = {"A": (caller(name, "48MiB"), 48 * MiB), "B": (caller(name, "32MiB"), 32 * MiB)}
    for _ in range(30):  # allocs and frees (each polls) while the callers run
        say(f"churn 1 {step}")
        if all(p.poll() is not None for p, _ in callers.values()):
            break
    done = {k: (*finish(p), size) for k, (p, size) in callers.items()}
    revs = sorted(ans["revision"] for _, ans, _ in done.values())
    assert revs == [before + 1, before + 2]  # one revision each, never shared
    (rc_lo, lo, _), (rc_hi, hi, size_hi) = sorted(done.values(), key=lambda d: d[1]["revision"])
    assert (rc_hi, hi["answer"]) == (0, "acknowledged")  # the newest request always holds
    info = control.read_segment(name)
    assert (info.limit, info.revision) == (size_hi, hi["revision"])
    if lo["answer"] == "superseded":  # replaced before or after the owner applied it
        assert rc_lo == 3
        assert lo["superseded_by"] == {"revision": hi["revision"],
                                       "request_id": hi["request_id"]}
    else:  # answered before the other request existed
        assert (rc_lo, lo["answer"], lo["superseded_by"]) == (0, "acknowledged", None)
    assert os.path.exists(control.segment_path(name))
