"""The mini engine's OpenAI-compatible server over 127.0.0.1, driven by the lab client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("torch")

from workbench.mini.client import Timed, complete, get_model_name, percentile, run_workload  # noqa: E402,E501
from workbench.mini.engine import Engine  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import get_config  # noqa: E402
from workbench.mini.server import decode, encode, shutdown_server, start_server  # noqa: E402


@pytest.fixture(scope="module")
def server():
    eng = Engine(get_config("tiny"), KVSpec(kv_bytes=8 << 20))
    srv = start_server(eng, "127.0.0.1", 0)
    yield srv
    shutdown_server(srv)
    eng.close()


def test_stream_and_plain_agree_and_match_the_engine(server):
    url = server.url
    assert get_model_name(url) == "tiny"
    plain = complete(url, "hello world", 12, stream=False)
    streamed = complete(url, "hello world", 12, stream=True)
    assert plain.ok and streamed.ok, (plain.error, streamed.error)
    assert plain.status == streamed.status == 200
    assert plain.text == streamed.text and len(streamed.text) == 12
    assert streamed.completion_tokens == 12 and streamed.prompt_tokens == len("hello world")
    assert streamed.finish_reason == "length"
    assert streamed.ttft_s <= streamed.e2e_s and len(streamed.chunk_times) == 12
    # token ids in give the same as the string they encode
    ids = complete(url, encode("hello world"), 12)
    assert ids.text == plain.text
    eng = Engine(get_config("tiny"), KVSpec(kv_bytes=8 << 20))
    assert decode(eng.generate([encode("hello world")], 12)[0]) == plain.text


def test_concurrent_requests_all_complete(server):
    reqs = [Timed(0.01 * i, "x" * (3 + i), 8) for i in range(10)]
    res = run_workload(server.url, reqs)
    assert all(r.ok and r.completion_tokens == 8 for r in res), [r.error for r in res]
    assert percentile([r.ttft_s for r in res], 99) > 0


def _post(url: str, body: dict) -> tuple[int, dict | bytes]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            data = r.read()
            return r.status, json.loads(data) if body.get("stream") is not True else data
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_bad_requests_get_400(server):
    for body, param in (({"prompt": {"bad": 1}}, "prompt"),
                        ({"prompt": "a" * 10, "max_tokens": 10**6}, "max_tokens"),
                        ({"prompt": [10**7]}, "prompt")):
        status, reply = _post(server.url, body)
        assert status == 400 and reply["error"]["param"] == param
        assert reply["error"]["type"] == "invalid_request_error"
    refused = complete(server.url, "abc", 0)  # the load client keeps the server's answer
    assert not refused.ok and refused.status == 400 and refused.retry_after_s is None
    assert refused.error.startswith("HTTP 400: max_tokens: ")
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        assert r.status == 200


def test_sse_framing_usage_and_stop_token_ids(server):
    status, raw = _post(server.url, {"prompt": "abc", "max_tokens": 5, "stream": True,
                                     "temperature": 0,
                                     "stream_options": {"include_usage": True}})
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    assert status == 200 and events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    _, plain = _post(server.url, {"prompt": "abc", "max_tokens": 5, "temperature": 0})
    assert [len(c["choices"][0]["text"]) for c in chunks[:6]] == [1] * 5 + [0]
    assert "".join(c["choices"][0]["text"] for c in chunks[:5]) == plain["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:6]] == [None] * 5 + ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    # a stop token id ends the completion there (the stop token itself is kept, as before)
    _, full = _post(server.url, {"prompt": "abc", "max_tokens": 8, "temperature": 0})
    text = full["choices"][0]["text"]
    stop_id = ord(text[3])
    cut = text.index(text[3]) + 1
    _, stopped = _post(server.url, {"prompt": "abc", "max_tokens": 8, "temperature": 0,
                                    "stop_token_ids": [stop_id]})
    assert stopped["choices"][0]["text"] == text[:cut]
    assert stopped["choices"][0]["finish_reason"] == ("length" if cut == 8 else "stop")


def test_metrics_endpoint_names_queue_tokens_and_pool(server):
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"vllm:num_requests_waiting", "vllm:num_requests_running",
            "vllm:prompt_tokens", "vllm:generation_tokens",
            "workbench_kv_mapped_bytes", "workbench_kv_reserved_bytes",
            "workbench_kv_limit_bytes"} <= names


def test_percentile():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
