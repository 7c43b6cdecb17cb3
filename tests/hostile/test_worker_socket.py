"""A worker's socket under hostile peers, in real processes over real Unix sockets: idle peers
never keep the coordinator out (it is let in first; strangers time out), a peer that never reads
its replies makes nobody else wait, every integer of a frame is range-checked (nothing outside
int64 is echoed back), and a worker given a bad config ends in one line, not a traceback."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tpp.helpers import GEO
from workbench.core.coordinator import WorkerId
from workbench.core.messages import INT_MAX, INT_MIN, SERVER_REQUESTS, decode_request, echo_of
from workbench.errors import ProtocolError
from workbench.transport import WorkerGroup, wire
from workbench.transport.paths import SOCKET_DIR_ENV
from workbench.transport.server import MAX_CONNS, SEND_TIMEOUT

ROOT = Path(__file__).parents[2]
W0 = WorkerId(0, 0)


@pytest.fixture
def group(monkeypatch):
    base = tempfile.mkdtemp(prefix="wbkv-")
    monkeypatch.setenv(SOCKET_DIR_ENV, os.path.join(base, "s"))
    g = WorkerGroup(GEO, tp=1, name="sockets")
    try:
        yield g
        assert g.send(W0, {"op": "ping"}, timeout=30)["status"] == "ok"
    finally:
        g.shutdown()
        shutil.rmtree(base, ignore_errors=True)


def frame(obj: dict | bytes) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


# A stranger: another process holding many connections, some idle, some with half a header. It
# reports when the worker dropped each one (CLOCK_MONOTONIC is one clock for every process).
STRANGER = textwrap.dedent("""
    import json, selectors, socket, sys, time
    path, n = sys.argv[1], int(sys.argv[2])
    socks = []
    for i in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        if i % 3 == 0:
            try:
                s.sendall(b"\\x00")  # a frame begun, never finished
            except (BrokenPipeError, ConnectionResetError):
                pass  # over the cap: the worker closed it already
        socks.append(s)
    print("connected", flush=True)
    sel = selectors.DefaultSelector()
    for i, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    dropped = {}
    deadline = time.monotonic() + 120
    while len(dropped) < n and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1):
            try:
                data = key.fileobj.recv(1)
            except (ConnectionResetError, BlockingIOError) as err:
                data = b"" if isinstance(err, ConnectionResetError) else None
            if data == b"":  # the worker dropped it
                dropped[key.data] = time.monotonic()
                sel.unregister(key.fileobj)
    print(json.dumps(dropped), flush=True)
""")


def test_idle_strangers_never_keep_the_coordinator_out_and_time_out(group):
    """No duration is asserted: the coordinator's answers come before the worker drops any
    stranger holding a place (so it was let in past a full house, not after timeouts), the ones
    over the cap go before those, and every stranger is dropped in the end."""
    n = MAX_CONNS + 6
    stranger = subprocess.Popen([sys.executable, "-c", STRANGER, str(group.paths[W0]), str(n)],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert stranger.stdout.readline().strip() == "connected"
        answered = []
        for _ in range(5):  # the coordinator's own connections, each new, each let in
            group.transport.close()
            assert group.send(W0, {"op": "ping"}, timeout=30)["status"] == "ok"
            answered.append(time.monotonic())
        dropped = {int(i): t for i, t in json.loads(stranger.stdout.readline()).items()}
        assert sorted(dropped) == list(range(n))  # all dropped by the worker, none left
        held = [dropped[i] for i in range(MAX_CONNS)]  # the places, in connect order
        over = [dropped[i] for i in range(MAX_CONNS, n)]  # closed at accept
        assert answered[0] < min(held)  # let in while every place was taken
        assert max(over) < min(held)
        assert stranger.wait(timeout=30) == 0
    finally:
        stranger.kill()
        stranger.wait()


NO_READER = textwrap.dedent("""
    import json, socket, struct, sys, time
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    body = json.dumps({"op": "state", "seq": 1}).encode()
    s.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # request replies, never read one
        try:
            s.send(struct.pack(">I", len(body)) + body)
            sent += 1
        except BlockingIOError:
            if sent > 50:
                break
            time.sleep(0.01)
    print("stuffed", sent, flush=True)
    s.setblocking(True)
    s.settimeout(60)
    time.sleep(float(sys.argv[2]))
    try:
        while s.recv(1 << 20):
            pass
        print("dropped", flush=True)
    except OSError as err:
        print("dropped", err, flush=True)
""")


@pytest.mark.parametrize("stranger", [True, False], ids=["stranger", "same-process-peer"])
def test_a_peer_that_never_reads_makes_nobody_else_wait(group, stranger):
    if stranger:
        p = subprocess.Popen([sys.executable, "-c", NO_READER, str(group.paths[W0]),
                              str(SEND_TIMEOUT + 3)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().startswith("stuffed")
    else:  # the coordinator's own process opening a second connection that never reads
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(group.paths[W0]))
        s.setblocking(False)
        body = frame({"op": "state", "seq": 1})
        try:
            for _ in range(100_000):
                s.send(body)
        except BlockingIOError:
            pass
    try:
        worst = 0.0
        for _ in range(10):
            t0 = time.monotonic()
            assert group.send(W0, {"op": "ping"}, timeout=10)["status"] == "ok"
            worst = max(worst, time.monotonic() - t0)
        assert worst < 1.0, f"a ping waited {worst:.2f} s behind a peer that never reads"
        if stranger:
            assert p.stdout.readline().startswith("dropped")  # after SEND_TIMEOUT, not before
    finally:
        if stranger:
            p.kill()
            p.wait()
        else:
            s.close()


out_of_64_bits = st.one_of(st.integers(INT_MAX + 1, 1 << 200),
                           st.integers(-(1 << 200), INT_MIN - 1))


@settings(max_examples=200, deadline=None)
@given(big=out_of_64_bits, field=st.sampled_from(["seq", "epoch", "k"]))
def test_no_scalar_integer_past_64_bits_is_accepted_or_echoed(big, field):
    """(A page id past 64 bits is refused by the pool's own range, naming it: test_frames.)"""
    if field == "seq":
        msg = {"op": "ping", "seq": big}
    elif field == "epoch":
        msg = {"op": "barrier", "seq": 1, "epoch": big}
    else:
        msg = {"op": "inject", "seq": 1, "device": {"map": big}}
    with pytest.raises(ProtocolError):
        decode_request(msg, SERVER_REQUESTS)
    assert echo_of(msg)[1] in (None, 1)


def test_seq_2_70_is_refused_and_not_echoed_over_a_real_socket(group):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(group.paths[W0]))
        s.sendall(frame(b'{"op":"ping","seq":%d}' % (1 << 70)))
        r = wire.recv(s)
        assert (r["status"], r["error_type"], r.get("seq")) == ("error", "bad_request", None)
        assert str(1 << 70) not in json.dumps({k: v for k, v in r.items() if k != "message"})
        s.sendall(frame(b'{"op":"ping","seq":1,"seq":2}'))  # ambiguous: the frame is dropped
        assert s.recv(16) == b""


GOOD = {"geometry": {"num_layers": 2, "kv_heads": 2, "head_dim": 64, "num_blocks": 64},
        "parent": 1, "name": "w"}
configs = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", "{", "null", "[]", "42", '"x"', '{"path": 1}', "NaN",
                     '{"geometry": {}, "path": "/tmp/x", "parent": 1, "name": "w", "name": "v"}']),
    st.builds(lambda k: json.dumps({x: v for x, v in {**GOOD, "path": "/tmp/w"}.items()
                                    if x != k}), st.sampled_from([*GOOD, "path"])),
    st.builds(lambda d: json.dumps({**GOOD, "path": f"/nonexistent-{d}/deeper/w.sock"}),
              st.integers(0, 1 << 30)),
    st.builds(lambda g: json.dumps({**GOOD, "geometry": g, "path": "/tmp/wbx/w.sock"}),
              st.dictionaries(st.sampled_from(["num_layers", "kv_heads", "bogus"]),
                              st.one_of(st.integers(-3, 3), st.text(max_size=3)), max_size=3)),
)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(cfg=configs)
def test_a_worker_given_a_bad_config_ends_in_one_line(cfg):
    r = subprocess.run([sys.executable, "-m", "workbench.transport.server", cfg], cwd=ROOT,
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = r.stderr.strip().splitlines()
    assert r.returncode in (1, 2) and len(lines) == 1, (cfg, r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
