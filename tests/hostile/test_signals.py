"""Every exit cleans up: a process that owns control segments (or worker processes and their
socket directory) and is sent SIGTERM, SIGINT or SIGHUP leaves nothing in the shm folder, and
ends by that signal. A full shm folder is a one-line refusal (no SIGBUS, no temporary file); an
unwritable one is one line too. Real processes, real signals, real tmpfs mounts (skipped in one
line where the machine does not allow mounting)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.pool_owner import spawn_owner

ROOT = Path(__file__).parents[2]
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


def env_for(shm: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "WORKBENCH_KV_SHM_DIR": str(shm), "PYTHONPATH": str(ROOT), **more}


def entries(shm: Path) -> list[str]:
    return sorted(os.listdir(shm))


def wait_until(cond, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def died_by(p: subprocess.Popen, sig: int, timeout: float = 60.0, exact: bool = True) -> None:
    """Ended by ``sig`` (or, where not ``exact``, exited 128 + sig: the shell's same code)."""
    rc = p.wait(timeout=timeout)
    ok = (-sig,) if exact else (-sig, 128 + sig)
    assert rc in ok, f"exit status {rc}, expected death by {signal.Signals(sig).name}"


@pytest.fixture
def shm(tmp_path: Path) -> Path:
    d = tmp_path / "shm"
    d.mkdir()
    return d


def long_trace(path: Path, pools: int, lines: int) -> Path:
    """A trace whose pools have IPC names, long enough to be mid-run when signalled."""
    ops = [{"op": "pool", "pool": f"p{i}", "num_blocks": 64,
            "ipc_name": f"sig_{i}_{uuid.uuid4().hex[:6]}"} for i in range(pools)]
    for k in range(lines):
        ops.append({"op": "alloc", "pool": f"p{k % pools}", "n": 3, "tag": "t"})
        ops.append({"op": "free", "pool": f"p{k % pools}", "tag": "t"})
    path.write_text("\n".join(json.dumps(o) for o in ops))
    return path


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_replay_signalled_mid_run_removes_its_segments_and_dies_by_the_signal(shm, tmp_path, sig):
    trace = long_trace(tmp_path / "t.jsonl", pools=3, lines=150_000)
    p = subprocess.Popen([sys.executable, "-m", "workbench", "replay", str(trace), "--json"],
                         env=env_for(shm), cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len([e for e in entries(shm) if e.startswith("wbkv_")]) == 3
                   or p.poll() is not None, what="three segments")
        assert p.poll() is None, f"replay ended before the signal: {p.stderr.read()}"
        p.send_signal(sig)
        died_by(p, sig)
    finally:
        p.kill()
        p.wait()
    assert entries(shm) == []
    assert "Traceback" not in p.stderr.read()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_pool_owner_under_a_storm_of_kvctl_limit_calls_cleans_up_on_a_signal(shm, sig):
    """24 concurrent `kvctl limit` callers, some signalled themselves mid-call, then the owner
    signalled: no segment, no half-written file, no caller with a traceback."""
    name = f"storm_{uuid.uuid4().hex[:8]}"
    owner = spawn_owner(name, env_for(shm))
    try:
        assert owner.stdout.readline().strip() == "ready"
        callers = [subprocess.Popen(
            [sys.executable, "-m", "workbench", "kvctl", "limit", name, f"{8 * (1 + i % 9)}MiB",
             "--wait", "5"], env=env_for(shm), cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) for i in range(24)]
        for i, c in enumerate(callers):
            if i % 4 == 0:
                time.sleep(0.05)
                c.send_signal(signal.SIGINT if i % 8 else signal.SIGTERM)
        owner.stdin.write("poll\n")
        owner.stdin.flush()
        owner.stdout.readline()
        owner.send_signal(sig)
        died_by(owner, sig)
        for i, c in enumerate(callers):
            _, err = c.communicate(timeout=60)
            if i % 4:  # (one signalled while Python itself starts may print Python's trace)
                assert "Traceback" not in err, err
    finally:
        owner.kill()
        owner.wait()
    assert entries(shm) == []


INTERRUPTED = textwrap.dedent("""
    import os, signal, sys
    from workbench.config import PoolConfig
    from workbench.core.geometry import KVGeometry
    from workbench.core.ledger import KVCacheManager
    from workbench.sim.device import SimDevice
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, num_blocks=640)
    pools = [KVCacheManager(geo, SimDevice(), name=f"p{i}",
                            config=PoolConfig(ipc_name=f"{sys.argv[1]}_{i}"))
             for i in range(int(sys.argv[2]))]
    mode = sys.argv[3]
    if mode == "exception":
        raise RuntimeError("an interrupted run")
    if mode == "exit":
        sys.exit(5)
    os.kill(os.getpid(), int(mode))  # a signal arriving mid-run
    signal.pause()
""")


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(pools=st.integers(1, 4),
       mode=st.sampled_from(["exception", "exit", *[str(int(s)) for s in SIGNALS]]))
def test_every_way_out_of_a_segment_owning_process_removes_its_segments(tmp_path_factory,
                                                                        pools, mode):
    shm = tmp_path_factory.mktemp("shm")
    p = subprocess.run([sys.executable, "-c", INTERRUPTED, f"i{uuid.uuid4().hex[:6]}",
                        str(pools), mode], env=env_for(shm), cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    if mode.isdigit():
        assert p.returncode == -int(mode), p.stderr
    else:
        assert p.returncode != 0
    assert entries(shm) == []


WORKERS = textwrap.dedent("""
    import os, signal
    from workbench.core.geometry import KVGeometry
    from workbench.transport.client import WorkerGroup
    g = WorkerGroup(KVGeometry(num_layers=2, kv_heads=8, head_dim=128, num_blocks=64), tp=2)
    print(" ".join(str(p.pid) for p in g.procs.values()), g.dir, flush=True)
    signal.pause()
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_coordinator_signalled_takes_its_workers_and_socket_dir_with_it(tmp_path, sig):
    base = Path(tmp_path, "s")
    p = subprocess.Popen([sys.executable, "-c", WORKERS], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(ROOT),
                              "WORKBENCH_KV_SOCKET_DIR": str(base)})
    try:
        *pids, sockdir = p.stdout.readline().split()
        assert pids, p.stderr.read()
        p.send_signal(sig)
        died_by(p, sig)
    finally:
        p.kill()
        p.wait()
    for pid in map(int, pids):
        wait_until(lambda pid=pid: not _running(pid), 30, f"worker {pid} to end")
    assert not Path(sockdir).exists()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@contextmanager
def tmpfs(where: Path, size: str, read_only: bool = False):
    where.mkdir()
    opts = f"size={size}" + (",ro" if read_only else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


OWN_ONE = textwrap.dedent("""
    import sys
    from workbench.config import PoolConfig
    from workbench.core.geometry import KVGeometry
    from workbench.core.ledger import KVCacheManager
    from workbench.errors import WorkbenchError
    from workbench.sim.device import SimDevice
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, num_blocks=int(sys.argv[2]))
    try:
        kv = KVCacheManager(geo, SimDevice(), name="p", config=PoolConfig(ipc_name=sys.argv[1]))
    except WorkbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    kv.close()
    print("ok")
""")


def test_a_full_shm_folder_is_a_one_line_refusal_not_sigbus(tmp_path):
    with tmpfs(tmp_path / "full", "64k") as shm:
        filler = shm / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:  # fill it to the last byte
            while os.write(fd, b"x" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        r = subprocess.run([sys.executable, "-c", OWN_ONE, "full", "640"], env=env_for(shm),
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (r.returncode, r.stderr)  # -7 was SIGBUS
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "has no room for a" in lines[0] and "ENOSPC" in lines[0], lines
        assert entries(shm) == ["filler"]  # no temporary segment left behind
        filler.unlink()
        r = subprocess.run([sys.executable, "-c", OWN_ONE, "full", "640"], env=env_for(shm),
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout.strip()) == (0, "ok"), r.stderr
        assert entries(shm) == []


def test_a_read_only_shm_folder_is_one_line(tmp_path):
    with tmpfs(tmp_path / "ro", "64k", read_only=True) as shm:
        r = subprocess.run([sys.executable, "-c", OWN_ONE, "ro", "640"], env=env_for(shm),
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"the shm folder {shm} takes no segment (EROFS" in lines[0], \
            lines
        trace = tmp_path / "t.jsonl"
        trace.write_text(json.dumps({"op": "pool", "pool": "a", "ipc_name": "ro"}))
        r = subprocess.run([sys.executable, "-m", "workbench", "replay", str(trace)],
                           env=env_for(shm), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "EROFS" in r.stderr


def test_a_missing_shm_folder_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-c", OWN_ONE, "gone", "640"],
                       env=env_for(tmp_path / "nowhere"), cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # the settings refuse the folder when they are read; a folder gone later is ENOENT
    assert "not an existing directory" in r.stderr or "ENOENT" in r.stderr


SERVERS = {
    "serve": ["serve", "--port", "0", "--device", "cpu", "--kv-memory", "8MiB"],
    "export": ["kvctl", "export", "--port", "0"],
}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
@pytest.mark.parametrize("cmd", list(SERVERS))
def test_servers_shut_down_in_order_and_end_by_the_signal(shm, cmd, sig):
    if cmd == "serve":
        pytest.importorskip("torch")
    p = subprocess.Popen([sys.executable, "-m", "workbench", *SERVERS[cmd]], env=env_for(shm),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert "http://" in line, p.stderr.read() if p.poll() is not None else line
        p.send_signal(sig)
        died_by(p, sig, timeout=60, exact=cmd == "serve")  # uvicorn's own exit for export
        assert "Traceback" not in p.stderr.read()
    finally:
        p.kill()
        p.wait()
    assert entries(shm) == []
