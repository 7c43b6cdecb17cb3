"""HTTP framing on the workbench's servers (``serve``, ``kvctl export``: one uvicorn protocol,
:mod:`workbench.observe.asgi`), over real sockets: a request with both Content-Length and
Transfer-Encoding is refused with one 400 and the connection closed, so a request smuggled
behind it is never answered; every framing 400 is an OpenAI-style JSON body naming the fault."""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.observe.asgi import serve_in_thread

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


async def echo_app(scope, receive, send):  # answers every request with its path
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = json.dumps({"path": scope["path"]}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port():
    uv, thread, bound = serve_in_thread(echo_app, "127.0.0.1", 0)
    yield bound
    uv.should_exit = True
    thread.join(timeout=30)


def exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw``, read until the server closes (or 10 s of silence)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def responses(data: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each HTTP response in ``data`` (bodies by Content-Length)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        fields = (ln.partition(b":") for ln in head.split(b"\r\n")[1:])
        length = next(int(v) for k, _, v in fields if k.strip().lower() == b"content-length")
        out.append((status, rest[:length]))
        data = rest[length:]
    return out


def assert_one_json_400(data: bytes, words: str) -> None:
    got = responses(data)
    assert len(got) == 1, got  # nothing answered behind it
    status, body = got[0]
    err = json.loads(body)["error"]
    assert status == 400 and err["code"] == 400 and err["type"] == "invalid_request_error"
    assert words in err["message"], err


def test_a_plain_request_is_answered(port):
    assert responses(exchange(port, b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                     ) == [(200, b'{"path": "/ok"}')]


cl = st.sampled_from([b"Content-Length", b"content-length", b"CONTENT-LENGTH"])
te = st.sampled_from([b"Transfer-Encoding", b"transfer-encoding", b"TRANSFER-ENCODING"])
chunked = st.sampled_from([b"chunked", b"CHUNKED", b"Chunked"])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cl=cl, te=te, chunked=chunked, te_first=st.booleans(), length=st.integers(0, 64))
def test_length_and_chunked_together_are_refused_and_nothing_behind_is_answered(
        port, cl, te, chunked, te_first, length):
    heads = [cl + b": " + str(length).encode(), te + b": " + chunked]
    if te_first:
        heads.reverse()
    raw = (b"POST /first HTTP/1.1\r\nHost: x\r\n" + b"\r\n".join(heads) + b"\r\n\r\n"
           b"0\r\n\r\n" + SMUGGLED)
    assert_one_json_400(exchange(port, raw), "Content-Length together with Transfer-Encoding")


@pytest.mark.parametrize("raw, words", [
    (b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", "malformed HTTP request"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc",
     "malformed HTTP request"),
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", "malformed"),
    (b"GET / HTTP/1.1\r\n\r\n", "malformed HTTP request"),  # no Host
])
def test_every_framing_400_is_a_json_body(port, raw, words):
    assert_one_json_400(exchange(port, raw + SMUGGLED), words)


def test_serve_refuses_a_smuggled_request(port):
    torch = pytest.importorskip("torch")  # noqa: F841 - the mini engine runs on it
    from workbench.mini.engine import Engine
    from workbench.mini.kv import KVSpec
    from workbench.mini.model import get_config
    from workbench.mini.server import shutdown_server, start_server

    eng = Engine(get_config("tiny"), KVSpec(kv_bytes=16 << 20))
    srv = start_server(eng, "127.0.0.1", 0)
    try:
        body = b'{"prompt": "ab", "max_tokens": 2}'
        smuggled = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" % (len(smuggled) + 5) + smuggled)
        assert_one_json_400(exchange(srv.port, raw),
                            "Content-Length together with Transfer-Encoding")
    finally:
        shutdown_server(srv)
        eng.close()
