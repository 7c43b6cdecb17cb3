"""Hostile frames against real TP/PP worker processes over real Unix sockets (issue 16 item 6).

Each test talks to a live worker the way a hostile or broken peer would, asserts the exact typed
error frame (or the connection being closed), and then asserts the worker still serves a normal
request. The fixture checks that no worker process, socket or directory outlives its group.
Unit-level hypothesis tests feed malformed message dicts to the message decoder.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import socket
import struct
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tpp.helpers import GEO
from workbench.core.coordinator import WorkerId
from workbench.core.messages import (
    SERVER_REQUESTS,
    WORKER_REQUESTS,
    ErrorType,
    Reply,
    Request,
    Status,
    decode_request,
)
from workbench.core.worker import WorkerState
from workbench.errors import FrameError, ProtocolError
from workbench.sim.device import SimDevice
from workbench.transport import WorkerGroup, wire
from workbench.transport.paths import SOCKET_DIR_ENV
from workbench.transport.server import FRAME_TIMEOUT

W0 = WorkerId(0, 0)
SLACK = 30.0  # generous: the machine is loaded; nothing here asserts a tight timing


@pytest.fixture
def group(monkeypatch):
    base = tempfile.mkdtemp(prefix="wbkv-")  # short: socket paths stay under 107 bytes
    monkeypatch.setenv(SOCKET_DIR_ENV, os.path.join(base, "s"))
    g = WorkerGroup(GEO, tp=1, name="hostile")
    try:
        yield g
        # the worker survived every hostile peer and still serves a normal request
        assert g.send(W0, {"op": "ping"}, timeout=SLACK)["status"] == "ok"
    finally:
        g.shutdown()
        assert all(p.poll() is not None for p in g.procs.values())  # no leaked process
        assert not g.dir.exists()  # no leaked sockets or directory
        shutil.rmtree(base, ignore_errors=True)


def peer(g: WorkerGroup) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(SLACK)
    s.connect(str(g.paths[W0]))
    return s


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def closed(s: socket.socket) -> bool:
    """True when the worker closed the connection without answering."""
    return s.recv(16) == b""


def ask(s: socket.socket, msg: object) -> dict:
    s.sendall(frame(json.dumps(msg).encode()))
    return wire.recv(s)


def refusal(msg: object) -> str:
    """The message of the ProtocolError the decoder gives ``msg`` (what the worker must send)."""
    with pytest.raises(ProtocolError) as err:
        decode_request(msg, SERVER_REQUESTS)
    return str(err.value)


# -- frames that cannot be decoded: the connection is dropped, the worker goes on -----------------
def test_oversized_frame_is_dropped_before_its_body(group):
    with peer(group) as s:
        s.sendall(struct.pack(">I", wire.MAX_FRAME + 1) + b"{")  # the body never follows
        assert closed(s)


def test_deeply_nested_frame_is_dropped_without_recursing(group):
    deep = b"[" * 100_000 + b"]" * 100_000
    with peer(group) as s:
        s.sendall(frame(deep))
        assert closed(s)
    inner = b'{"op":"map","seq":1,"pages":' + b"[" * 40 + b"1" + b"]" * 40 + b"}"
    with peer(group) as s:  # a message shape, nested past MAX_DEPTH inside a field
        s.sendall(frame(inner))
        assert closed(s)


@pytest.mark.parametrize("body", [
    b"\x80\x04\x95 not json, a pickle header",
    b"\xff\xfe\xfd",  # not UTF-8
    b"[1, 2, 3]",  # JSON, but not an object
    b'"map"',
    b"",
    b'{"op": "map", "pages": [1]',  # cut short inside the frame
    b'{"op": "map", "pages": [' + b"9" * 5000 + b"]}",  # an int past Python's digit limit
], ids=["pickle", "not-utf8", "array", "string", "empty", "unbalanced", "huge-int"])
def test_garbage_frames_are_dropped(group, body):
    with peer(group) as s:
        s.sendall(frame(body))
        assert closed(s)


# -- a stalled peer wedges nobody -----------------------------------------------------------------
def test_truncated_frame_and_silence_do_not_block_other_peers(group):
    with peer(group) as stalled:
        stalled.sendall(struct.pack(">I", 100) + b'{"op": "pi')  # 10 of 100 bytes, then silence
        t0 = time.monotonic()
        for _ in range(3):  # another peer is served at once, again and again
            assert group.send(W0, {"op": "ping"}, timeout=FRAME_TIMEOUT / 2)["status"] == "ok"
        assert closed(stalled)  # the stalled peer is dropped once its frame is overdue
        assert FRAME_TIMEOUT * 0.9 <= time.monotonic() - t0 < FRAME_TIMEOUT + SLACK


def test_trickled_frame_is_dropped_at_its_deadline(group):
    """One byte at a time does not extend the deadline: a frame has FRAME_TIMEOUT in all."""
    body = b'{"op": "ping", "seq": 1}' + b" " * 200
    data = frame(body)
    with peer(group) as s:
        t0 = time.monotonic()
        sent = 0
        while sent < len(data):
            try:
                s.sendall(data[sent:sent + 1])
            except OSError:  # the worker closed on us
                break
            sent += 1
            if select.select([s], [], [], 0.25)[0]:
                break
        assert closed(s)
        assert sent < len(data) and time.monotonic() - t0 < FRAME_TIMEOUT + SLACK


# -- well-framed JSON that is not a request: a typed error frame, the connection stays ------------
@pytest.mark.parametrize("msg", [
    {"op": "launch", "seq": 5},  # unknown kind
    {"seq": 6},  # no op
    {"op": 7, "seq": 8},  # op of the wrong type
    {"op": "map", "seq": 9},  # missing field
    {"op": "map", "seq": 10, "pages": [1], "mode": "fast"},  # extra field
    {"op": "map", "seq": 11, "pages": "1"},  # wrong type
    {"op": "map", "seq": 12, "pages": [True]},  # a bool is not a page id
    {"op": "barrier", "seq": 13, "epoch": 1.5},  # a float is not an int
    {"op": "prepare", "seq": "x", "txid": "t", "pages": [1]},  # a seq that is not an int
], ids=["unknown-op", "no-op", "op-type", "missing", "extra", "wrong-type", "bool-page",
        "float-epoch", "bad-seq"])
def test_malformed_message_gets_a_typed_error_frame(group, msg):
    with peer(group) as s:
        r = ask(s, msg)
        op = msg.get("op") if isinstance(msg.get("op"), str) else None
        seq = msg.get("seq") if isinstance(msg.get("seq"), int) else None
        want = {"status": "error", "error_type": "bad_request", "op": op, "seq": seq,
                "worker": "pp0/w0", "message": refusal(msg)}
        assert r == {k: v for k, v in want.items() if v is not None}  # None is not sent
        assert ask(s, {"op": "ping", "seq": 99})["status"] == "ok"  # the same connection


def test_bad_page_ids_are_refused_before_anything_is_touched(group):
    last = GEO.num_pages - 1
    with peer(group) as s:
        r = ask(s, {"op": "map", "seq": 3, "pages": [0, 2**70]})
        assert (r["status"], r["error_type"], r["op"], r["seq"]) == (
            "error", "bad_request", "map", 3)
        assert r["message"] == (f"page {2**70}: this pool's pages are 0..{last}. "
                                "Fix: send a page id of this pool")
        assert ask(s, {"op": "state", "seq": 4})["mapped"] == []  # nothing was mapped
        ask(s, {"op": "map", "seq": 5, "pages": [1]})
        r = ask(s, {"op": "prepare", "seq": 6, "txid": "t", "pages": [1, 1]})
        assert (r["error_type"], r["message"]) == (
            "bad_request", "pages [1, 1]: a page id appears twice. Fix: send each page id once")
        state = ask(s, {"op": "state", "seq": 7})  # refused before anything was touched
        assert (state["mapped"], state["retained"], "failed" in state) == ([1], [], False)
        assert ask(s, {"op": "unmap", "seq": 8, "pages": [1]})["status"] == "ok"


# -- the inject hook refuses anything malformed, and arms nothing ---------------------------------
@pytest.mark.parametrize("msg", [
    {"op": "inject", "seq": 1, "device": {"create": "1"}},
    {"op": "inject", "seq": 1, "device": {"format_disk": 1}},
    {"op": "inject", "seq": 1, "device": {"create": 0}},
    {"op": "inject", "seq": 1, "device": [["create", 1]]},
    {"op": "inject", "seq": 1, "drop_reply": "exit"},
    {"op": "inject", "seq": 1, "die_after": ["map"]},
    {"op": "inject", "seq": 1, "stall": "map", "seconds": 1e308},
    {"op": "inject", "seq": 1, "stall": "map", "seconds": -1},
    {"op": "inject", "seq": 1, "shell": "rm -rf /"},
], ids=["k-type", "unknown-call", "k-zero", "device-list", "drop-exit", "die-list",
        "stall-huge", "stall-negative", "extra"])
def test_bad_inject_is_refused_and_arms_nothing(group, msg):
    with peer(group) as s:
        r = ask(s, msg)
        assert r == {"status": "error", "error_type": "bad_request", "op": "inject", "seq": 1,
                     "worker": "pp0/w0", "message": refusal(msg)}
        m = ask(s, {"op": "map", "seq": 2, "pages": [1]})  # no device fault was armed
        assert (m["status"], m["newly_mapped"]) == ("ok", [1])
        assert ask(s, {"op": "unmap", "seq": 3, "pages": [1]})["status"] == "ok"


def test_non_finite_inject_seconds_is_refused(group):
    with peer(group) as s:  # Python's JSON reads NaN; the decoder must not
        s.sendall(frame(b'{"op":"inject","seq":1,"stall":"map","seconds":NaN}'))
        r = wire.recv(s)
        assert (r["status"], r["error_type"]) == ("error", "bad_request")
        assert r["message"].startswith("request inject: field 'seconds' is nan, not float")


# -- many peers at once -------------------------------------------------------------------------
def test_many_silent_peers_do_not_starve_the_coordinator(group):
    idle = [peer(group) for _ in range(20)]
    try:
        for s in idle[::2]:
            s.sendall(b"\x00\x00")  # half a length header
        assert group.send(W0, {"op": "ping"}, timeout=FRAME_TIMEOUT / 2)["status"] == "ok"
    finally:
        for s in idle:
            s.close()


# -- the decoder on its own (hypothesis) --------------------------------------------------------
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
_FIELDS = sorted({f for cls in SERVER_REQUESTS.values() for f in cls.__dataclass_fields__}
                 | {"op", "extra"})


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from([*SERVER_REQUESTS, "nope", ""]) | _JSON,
       fields=st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=5))
def test_decoder_refuses_malformed_dicts_with_a_protocol_error(op, fields):
    msg = {**fields, "op": op}
    try:
        req = decode_request(msg, SERVER_REQUESTS)
    except ProtocolError as err:
        assert str(err).count(". Fix: ") == 1  # what, why and the fix, in one line
        assert "\n" not in str(err)
        return
    assert isinstance(req, Request) and req.op == op
    assert decode_request(req.to_json(), SERVER_REQUESTS) == req


_REPLY_FIELDS = sorted(Reply.__dataclass_fields__) + ["extra"]


@settings(max_examples=400)
@given(fields=st.dictionaries(st.sampled_from(_REPLY_FIELDS),
                              _JSON | st.sampled_from(["ok", "error", "busy", "map"]), max_size=6))
def test_reply_decoder_refuses_malformed_dicts_with_a_protocol_error(fields):
    try:
        reply = Reply.from_json(fields)
    except ProtocolError as err:
        assert str(err).count(". Fix: ") == 1 and "\n" not in str(err)
        return
    assert Reply.from_json(reply.to_json()) == reply


_NEAR = st.builds(lambda op, f: {**f, "op": op}, st.sampled_from(list(WORKER_REQUESTS)),
                  st.dictionaries(st.sampled_from(_FIELDS),
                                  _JSON | st.lists(st.integers(-2, 20), max_size=3), max_size=4))


@settings(max_examples=300)
@given(msg=_JSON | _NEAR)
def test_worker_state_answers_any_json_with_a_reply(msg):
    w = WorkerState(GEO, SimDevice("h200"), name="pp0/w0")
    try:
        decode_request(msg)
        valid = True
    except ProtocolError:
        valid = False
    r = Reply.from_json(w.handle(msg))  # never raises; always a well-formed reply
    assert r.worker == "pp0/w0"
    if not valid:
        assert (r.status, r.error_type) == (Status.ERROR, ErrorType.BAD_REQUEST)
    else:
        assert r.op == msg["op"] and r.seq == msg.get("seq")


@settings(max_examples=200)
@given(value=_JSON, chunks=st.lists(st.integers(1, 7), min_size=1, max_size=40))
def test_frame_reader_is_chunking_independent_and_depth_is_exact(value, chunks):
    msg = {"v": value}
    data = wire.encode(msg) * 2
    reader, got, i = wire.FrameReader(), [], 0
    for n in chunks * (len(data) // sum(chunks) + 1):
        got += reader.feed(data[i:i + n])
        i += n
        if i >= len(data):
            break
    assert got == [msg, msg] and not reader.partial
    body = json.dumps(msg).encode()
    assert wire.nesting_depth(body) == _depth(msg)


def _depth(v: object) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


def test_decode_refuses_deep_nesting_before_parsing():
    body = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(FrameError, match="nested 100000 deep: the limit is 32"):
        wire.decode(body)
    ok = json.dumps({"a": [[1, {"b": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}]]}).encode()
    assert wire.decode(ok) == json.loads(ok)  # brackets inside strings do not count


def test_error_reply_message_is_bounded():
    r = Reply.error(ErrorType.BAD_REQUEST, "x" * 10_000)
    assert len(r.message) == 4096 and Reply.from_json(r.to_json()) == r


def test_a_backend_nobody_can_honour_fails_the_start_in_one_line(monkeypatch):
    from workbench.core.coordinator import TransportError

    base = tempfile.mkdtemp(prefix="wbkv-")
    monkeypatch.setenv(SOCKET_DIR_ENV, os.path.join(base, "s"))
    try:
        with pytest.raises(TransportError, match=r"exited \(1\) while starting") as err:
            WorkerGroup(GEO, tp=1, name="banana", backend="banana")
        tail = str(err.value).split("while starting: ", 1)[1]
        assert re.fullmatch(r"BackendUnavailable: [^\n]*'banana'[^\n]*\n", tail), tail  # one line
        assert list(Path(base, "s").iterdir()) == []  # no pool directory left behind
    finally:
        shutil.rmtree(base, ignore_errors=True)
