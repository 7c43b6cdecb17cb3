"""The mini server against hostile clients (over 127.0.0.1 only, every wait bounded): each bad
field gets a 400 JSON error naming it, a short body times out without stalling others, overload is
a 503 with Retry-After (never a reset), generated bodies never get a 5xx, and /metrics parses."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

pytest.importorskip("torch")

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from workbench.mini.client import complete  # noqa: E402
from workbench.mini.engine import Engine  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import get_config  # noqa: E402
from workbench.mini.protocol import MAX_TOKENS  # noqa: E402
from workbench.mini.server import ServerConfig, shutdown_server, start_server  # noqa: E402

CAPACITY = 4
BODY_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server():
    eng = Engine(get_config("tiny"), KVSpec(kv_bytes=8 << 20))
    srv = start_server(eng, "127.0.0.1", 0, config=ServerConfig(
        queue_capacity=CAPACITY, body_timeout_s=BODY_TIMEOUT_S))
    yield srv
    shutdown_server(srv)
    eng.close()


def request(srv, method: str, path: str, body: bytes | None = None, timeout: float = 30.0):
    """(status, headers, body bytes) of one request on its own connection."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def post(srv, body: dict | bytes, timeout: float = 30.0):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request(srv, "POST", "/v1/completions", raw, timeout)


def scrape(srv) -> dict[str, float]:
    """Every sample of /metrics, keyed ``name`` or ``name{label=value}``."""
    status, headers, data = request(srv, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(data.decode()):
        for s in fam.samples:
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def wait_for(pred, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


BAD_FIELDS = [
    ({"prompt": "x", "seed": "abc"}, "seed"),
    ({"prompt": "x", "seed": 2**70}, "seed"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "seed": 1.5}, "seed"),
    ({"prompt": "x", "temperature": -0.1}, "temperature"),
    ({"prompt": "x", "temperature": 1e300}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10**9}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "8"}, "max_tokens"),
    ({"prompt": "x" * 10, "max_tokens": 4090}, "max_tokens"),  # past the model's positions
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": {"bad": 1}}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": [2**40]}, "prompt"),
    ({"prompt": [True]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [600]}, "prompt"),  # outside the tiny model's 512-token vocabulary
    ({"prompt": "x" * 70_000}, "prompt"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stop": ["a"] * 5}, "stop"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": "x", "stop_token_ids": "1"}, "stop_token_ids"),
    ({"prompt": "x", "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
    ({"prompt": "x", "model": 123}, "model"),
    (b"{not json", "body"),
    (b"[1, 2]", "body"),
    (b'{"prompt": "x", "temperature": NaN}', "temperature"),
]


@pytest.mark.parametrize(("body", "param"), BAD_FIELDS, ids=[p for _, p in BAD_FIELDS])
def test_each_bad_field_gets_400_json_naming_it(server, body, param):
    status, headers, data = post(server, body)
    assert status == 400 and headers["Content-Type"] == "application/json"
    err = json.loads(data)["error"]
    assert err["param"] == param and err["code"] == 400
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith((param + ":", param + ".0:")), err["message"]


def test_tiny_temperature_is_greedy_not_an_error(server):
    texts = []
    for t in (1e-300, 0.0):
        status, _, data = post(server, {"prompt": "abc", "max_tokens": 6, "temperature": t})
        assert status == 200
        texts.append(json.loads(data)["choices"][0]["text"])
    assert texts[0] == texts[1] and len(texts[0]) == 6
    for t in (1e-5, 1e-3, 2.0):  # the smallest and largest temperatures that really sample
        status, _, data = post(server, {"prompt": "abc", "max_tokens": 6, "temperature": t,
                                        "seed": 2**63 - 1})
        assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 6


def test_stop_string_ends_the_completion_before_it(server):
    _, _, data = post(server, {"prompt": "abc", "max_tokens": 12, "temperature": 0})
    full = json.loads(data)["choices"][0]["text"]
    stop = full[5:7]
    _, _, data = post(server, {"prompt": "abc", "max_tokens": 12, "temperature": 0,
                               "stop": [stop]})
    ch = json.loads(data)["choices"][0]
    assert ch["text"] == full[:full.find(stop)] and ch["finish_reason"] == "stop"


def test_short_body_times_out_without_stalling_others(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n"
                     b"Content-Type: application/json\r\n\r\n{\"prompt\": \"ab")
        t0 = time.monotonic()
        status, _, data = post(server, {"prompt": "hello", "max_tokens": 4}, timeout=10)
        assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 4
        reply = b""
        while b"}}" not in reply:
            chunk = sock.recv(4096)
            assert chunk, reply
            reply += chunk
        waited = time.monotonic() - t0
    finally:
        sock.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    assert json.loads(body)["error"]["param"] == "body"
    assert BODY_TIMEOUT_S * 0.5 <= waited < BODY_TIMEOUT_S + 5


def test_body_over_the_limit_is_413(server):
    status, _, data = post(server, b" " * (server.cfg.max_body_bytes + 1))
    assert status == 413 and json.loads(data)["error"]["param"] == "body"


def test_64_clients_get_200_or_503_never_a_reset(server):
    before = scrape(server).get("workbench_server_rejected_total", 0.0)
    go = threading.Barrier(64)
    results: list[tuple | BaseException | None] = [None] * 64

    def client(i: int) -> None:
        try:
            go.wait(timeout=30)
            status, headers, data = post(server, {"prompt": f"client {i}", "max_tokens": 48},
                                         timeout=120)
            results[i] = (status, headers.get("Retry-After"), json.loads(data))
        except BaseException as err:  # noqa: BLE001 - a reset or timeout is the failure shown
            results[i] = err

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not any(isinstance(r, BaseException) or r is None for r in results), results
    ok = [r for r in results if r[0] == 200]
    busy = [r for r in results if r[0] == 503]
    assert len(ok) + len(busy) == 64 and ok and busy
    assert all(r[2]["usage"]["completion_tokens"] == 48 for r in ok)
    assert all(r[1] == "1" and r[2]["error"]["type"] == "overloaded" for r in busy)
    assert scrape(server)["workbench_server_rejected_total"] - before == len(busy)
    assert wait_for(lambda: scrape(server)["workbench_server_admitted_requests"] == 0)
    status, _, data = post(server, {"prompt": "after the storm", "max_tokens": 5})
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 5


def test_metrics_scrape_while_a_stream_runs_and_after_it_is_dropped(server):
    before = scrape(server)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(
        {"prompt": "abcd", "max_tokens": 1500, "stream": True}).encode())
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data: ")
    assert wait_for(lambda: scrape(server)["vllm:num_requests_running{model_name=tiny}"] == 1)
    live = scrape(server)
    assert live["workbench_server_admitted_requests"] == 1
    assert live["workbench_kv_mapped_bytes{pool=mini}"] > 0
    assert live["workbench_kv_used_bytes{pool=mini}"] > 0
    assert live["workbench_kv_limit_bytes{pool=mini}"] == 8 << 20
    assert live["workbench_kv_capacity_bytes{pool=mini}"] == 8 << 20
    assert "workbench_kv_reserved_bytes{pool=mini}" in live
    assert "vllm:num_requests_waiting{model_name=tiny}" in live
    assert live["workbench_server_queue_capacity"] == CAPACITY
    assert (live["vllm:prompt_tokens_total{model_name=tiny}"]
            == before["vllm:prompt_tokens_total{model_name=tiny}"] + 4)
    assert (live["vllm:generation_tokens_total{model_name=tiny}"]
            > before["vllm:generation_tokens_total{model_name=tiny}"])
    conn.close()  # the client goes away mid-stream: the engine must drop the request
    assert wait_for(lambda: scrape(server)["vllm:num_requests_running{model_name=tiny}"] == 0)
    after = scrape(server)
    assert after["workbench_server_admitted_requests"] == 0
    assert (after["vllm:generation_tokens_total{model_name=tiny}"]
            - before["vllm:generation_tokens_total{model_name=tiny}"]) < 1500


FIELDS = ["prompt", "max_tokens", "temperature", "seed", "n", "stream", "stream_options",
          "stop", "stop_token_ids", "model", "ignore_eos", "junk"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=8)


def _short(body: dict) -> dict:
    """Keep valid generations short, so examples stay fast (invalid values stay as drawn)."""
    mt = body.get("max_tokens")
    if type(mt) is int and 8 < mt <= MAX_TOKENS:
        body["max_tokens"] = mt % 8 + 1
    return body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6).map(_short)
       | st.fixed_dictionaries({"prompt": st.text(min_size=1, max_size=8)},
                               optional={f: JSON for f in FIELDS[1:]}).map(_short))
@example(body={"prompt": "a", "stream": True, "max_tokens": 2})
@example(body={"prompt": [1, 2], "stop": "zz", "seed": 0, "temperature": 0.5})
def test_generated_bodies_never_get_a_5xx(server, body):
    status, headers, data = post(server, body)
    if status == 200 and headers["Content-Type"].startswith("text/event-stream"):
        assert data.endswith(b"data: [DONE]\n\n")
        return
    reply = json.loads(data)
    if status == 200:
        assert reply["choices"][0]["finish_reason"] in ("length", "stop")
        return
    assert status == 400 and headers["Content-Type"] == "application/json", (status, reply)
    assert reply["error"]["param"].split(".")[0] in (*body, "prompt", "body")


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=64))
def test_generated_bytes_never_get_a_5xx(server, raw):
    status, _, data = post(server, raw)
    assert status in (200, 400), (status, data)
    assert status == 200 or json.loads(data)["error"]["param"] in ("body", "prompt")


def test_still_healthy_after_everything(server):
    status, _, data = request(server, "GET", "/health")
    assert status == 200 and json.loads(data) == {"status": "ok"}
    status, _, data = request(server, "GET", "/nowhere")
    assert status == 404 and json.loads(data)["error"]["code"] == 404


def test_half_sent_headers_do_not_stall_others(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Le")  # then silence
        status, _, data = post(server, {"prompt": "still here", "max_tokens": 3}, timeout=10)
        assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 3
    finally:
        sock.close()


def test_a_crashed_engine_answers_503_json_and_the_server_stays_up():
    eng = Engine(get_config("tiny"), KVSpec(kv_bytes=8 << 20))

    def broken_step():
        raise RuntimeError("injected engine fault")

    eng.step = broken_step
    srv = start_server(eng, "127.0.0.1", 0)
    try:
        for _ in range(2):  # the request that met the crash, then one after it
            status, headers, data = post(srv, {"prompt": "x", "max_tokens": 3}, timeout=30)
            err = json.loads(data)["error"]
            assert status == 503 and headers["Retry-After"] == "1"
            assert err["type"] == "server_error" and "restart `workbench serve`" in err["message"]
        refused = complete(srv.url, "x", 3, timeout=30)  # the load client reads the 503
        assert not refused.ok and refused.status == 503 and refused.retry_after_s == 1.0
        status, _, data = request(srv, "GET", "/health")
        assert status == 503 and json.loads(data) == {"status": "dead"}
        assert isinstance(srv.loop.error, RuntimeError)
    finally:
        shutdown_server(srv)
        eng.close()


@pytest.mark.parametrize("raw", [
    b"garbage\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: -5\r\n\r\n{}",
], ids=["not-http", "length-not-a-number", "negative-length"])
def test_malformed_http_is_a_400_and_the_server_serves_on(server, raw):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(raw)
        reply = b""
        while chunk := sock.recv(4096):  # uvicorn closes the connection after its 400
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400 ")
    status, _, data = post(server, {"prompt": "ok", "max_tokens": 2})
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 2
