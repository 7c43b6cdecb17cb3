"""``workbench kvctl export`` in its own process against a real pool owner process, in a private
segment directory with malformed entries planted beside the real segment: the scrape parses, shows
exactly the real pool with the sizes ``kvctl list`` reports, follows the owner's frees, and drops
the pool when its owner closes it. Every wait is bounded; only 127.0.0.1 is used."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.pool_owner import spawn_owner

KV_NAMES = ("mapped", "reserved", "limit", "used", "capacity")


def readline(proc: subprocess.Popen, timeout_s: float = 30.0) -> str:
    """One stdout line, or fail after ``timeout_s`` instead of hanging."""
    box: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: box.put(proc.stdout.readline()), daemon=True).start()
    try:
        return box.get(timeout=timeout_s).strip()
    except queue.Empty:
        pytest.fail(f"no line from {proc.args} within {timeout_s} s")


def scrape(url: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    return {(s.name, s.labels["pool"]): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name.startswith("workbench_kv_")}


def kvctl_rows(env: dict) -> dict[str, dict]:
    out = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "list", "--json"],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    return {r["name"]: r for r in json.loads(out)}


def expected(row: dict) -> dict[str, float]:
    return {n: float(row[n]) for n in KV_NAMES}


def pool_samples(samples: dict, pool: str) -> dict[str, float]:
    return {n: samples[(f"workbench_kv_{n}_bytes", pool)] for n in KV_NAMES
            if (f"workbench_kv_{n}_bytes", pool) in samples}


@pytest.fixture
def env(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "wbkv_empty").write_bytes(b"")  # a crash's leftover: no header at all
    (shm / "wbkv_foreign").write_bytes(b"NOTASEGMENT" + bytes(200))  # someone else's file
    return {**os.environ, "WORKBENCH_KV_SHM_DIR": str(shm)}


def test_export_serves_every_live_pool_and_skips_malformed_segments(env):
    name = f"x_{uuid.uuid4().hex[:10]}"
    owner = spawn_owner(name, env)
    exporter = subprocess.Popen([sys.executable, "-m", "workbench", "kvctl", "export",
                                 "--port", "0"], env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    try:
        assert readline(owner) == "ready"
        line = readline(exporter)
        prefix = "exporting KV pool metrics at http://127.0.0.1:"
        assert line.startswith(prefix) and line.endswith("/metrics"), line
        url = line[len("exporting KV pool metrics at "):]

        samples = scrape(url)
        assert {pool for _, pool in samples} == {name}  # the planted files are skipped
        held = expected(kvctl_rows(env)[name])
        assert pool_samples(samples, name) == held
        assert held["used"] == 5 * 8 << 20 and held["mapped"] >= held["used"]
        assert held["capacity"] == held["limit"] == 10 * 8 << 20

        owner.stdin.write("free\n")
        owner.stdin.flush()
        assert readline(owner) == "freed"
        freed = pool_samples(scrape(url), name)
        assert freed == expected(kvctl_rows(env)[name]) and freed["used"] < held["used"]

        owner.stdin.write("quit\n")
        owner.stdin.flush()
        assert readline(owner) == "closed"
        assert owner.wait(timeout=30) == 0
        assert scrape(url) == {}  # the pool closed: nothing left to export
    finally:
        for p in (owner, exporter):
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)


def test_export_refuses_a_bad_port_in_one_line(env):
    r = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "export", "--port", "70000"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: port 70000: is outside 0..65535")
    assert "Traceback" not in r.stderr


def test_export_refuses_a_port_in_use(env):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "export", "--port",
                            str(port)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and time.monotonic() - t0 < 60
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: 127.0.0.1:{port}: cannot listen")


def test_a_local_client_holding_its_share_never_locks_a_loopback_scraper_out(env):
    """Every local client shares 127.0.0.1 with the scraper: one that keeps its address's share
    of idle connections open (re-opening each one the exporter drops) must not turn the scrape
    away. No timing: the scrape comes while the share is full."""
    import socket

    from workbench.cli.kvexport import PER_CLIENT

    exporter = subprocess.Popen([sys.executable, "-m", "workbench", "kvctl", "export",
                                 "--port", "0"], env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    held: list[socket.socket] = []
    try:
        url = readline(exporter).rsplit(" ", 1)[-1]
        port = int(url.rsplit(":", 1)[1].split("/")[0])

        def fill() -> None:
            for s in [s for s in held if _closed(s)]:
                held.remove(s)
                s.close()
            while len(held) < PER_CLIENT:
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
                held.append(s)

        for _ in range(3):
            fill()
            assert scrape(url) == {}  # answered (no pools here), not dropped at once
        assert sum(_closed(s) for s in held) >= 1  # an idle holder made room each time
    finally:
        for s in held:
            s.close()
        exporter.terminate()
        exporter.wait(timeout=30)


def _closed(s) -> bool:
    """Closed by the exporter (without waiting: a socket still open answers nothing yet)."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)
