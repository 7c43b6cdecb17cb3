"""The mini engine's OpenAI-compatible server over 127.0.0.1, driven by the lab client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

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


def test_bad_requests_get_400(server):
    def post(body: dict) -> int:
        req = urllib.request.Request(server.url + "/v1/completions",
                                     data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as err:
            return err.code

    assert post({"prompt": {"bad": 1}}) == 400
    assert post({"prompt": "a" * 10, "max_tokens": 10**6}) == 400
    assert post({"prompt": [10**7]}) == 400
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        assert r.status == 200


def test_percentile():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
