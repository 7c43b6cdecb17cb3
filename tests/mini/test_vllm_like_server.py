"""The mini server as a vLLM user meets it: chat completions through OpenAI's client (plain and
streamed), a model's own card, the prefix-cache reset giving cached blocks back, every series
vLLM exports under vLLM's name, and ``workbench serve`` publishing its pool under
``WORKBENCH_KV_IPC_NAME`` (or ``--ipc-name``) so that ``kvctl limit`` reaches it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from workbench.cli.lab import free_port  # noqa: E402
from workbench.core import control  # noqa: E402
from workbench.mini.engine import Engine, EngineConfig  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import get_config  # noqa: E402
from workbench.mini.protocol import ChatMessage, chat_prompt, encode  # noqa: E402
from workbench.mini.server import shutdown_server, start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VLLM_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
               "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:kv_cache_usage_perc",
               "vllm:num_preemptions", "vllm:request_success", "vllm:prefix_cache_queries",
               "vllm:prefix_cache_hits", "vllm:time_to_first_token_seconds",
               "vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
               "vllm:e2e_request_latency_seconds")
USER = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server():
    eng = Engine(get_config("tiny"), KVSpec(kv_bytes=8 << 20),
                 cfg=EngineConfig(prefix_caching=True))
    srv = start_server(eng, "127.0.0.1", 0)
    yield srv
    shutdown_server(srv)
    eng.close()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                       timeout=60) as c:
        yield c


def _families(server) -> dict:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(fams: dict, name: str, **labels: str) -> float:
    return sum(s.value for s in fams[name].samples
               if s.name in (name, name + "_total") and labels.items() <= s.labels.items())


def test_chat_plain_and_streamed_agree(client):
    plain = client.chat.completions.create(model="tiny", messages=USER, max_tokens=8,
                                           temperature=0)
    msg = plain.choices[0].message
    assert plain.object == "chat.completion" and plain.id.startswith("chatcmpl-")
    assert msg.role == "assistant" and len(msg.content) == 8
    assert plain.choices[0].finish_reason == "length"
    prompt = encode(chat_prompt([ChatMessage(**m) for m in USER]))
    assert plain.usage.prompt_tokens == len(prompt) and plain.usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(model="tiny", messages=USER, max_tokens=8,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == msg.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_chat_refuses_in_openai_shape(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=[], max_tokens=4)
    assert err.value.body["param"] == "messages"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=USER, max_tokens=4)


def test_a_model_card_by_id(client):
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nosuch")


def test_vllm_series_under_vllm_names(server, client):
    client.completions.create(model="tiny", prompt="x" * 40, max_tokens=3, temperature=0)
    fams = _families(server)
    missing = [n for n in VLLM_SERIES if n not in fams]
    assert missing == [], missing
    assert not [n for n in fams if n.startswith("workbench_server_") and n.removeprefix(
        "workbench_server_") in ("queue_depth", "running_requests", "prompt_tokens",
                                 "generation_tokens")]
    assert _value(fams, "vllm:request_success", finished_reason="length") >= 1
    assert _value(fams, "vllm:prompt_tokens", model_name="tiny") >= 40
    assert 0 <= _value(fams, "vllm:kv_cache_usage_perc") <= 1


def test_reset_prefix_cache_gives_cached_blocks_back(server, client):
    long = "a shared system prompt, long enough for several full blocks. " * 2
    for _ in range(2):
        client.completions.create(model="tiny", prompt=long, max_tokens=2, temperature=0)
    fams = _families(server)
    assert _value(fams, "vllm:prefix_cache_hits") > 0  # the second prompt hit the first's
    r = httpx.post(server.url + "/reset_prefix_cache", timeout=30)
    assert r.status_code == 200 and r.json()["evicted_blocks"] > 0
    again = httpx.post(server.url + "/flush_cache", timeout=30)
    assert again.status_code == 200 and again.json()["evicted_blocks"] == 0


def _serve(port: int, env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "workbench", "serve", "--model", "tiny", "--device", "cpu",
         "--kv-cache-memory-bytes", "64MiB", "--max-num-batched-tokens", "512", "--port",
         str(port), *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("via", ["env", "flag"])
def test_serve_publishes_its_pool_and_kvctl_limits_it(via, tmp_path):
    name = f"srv_{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("WORKBENCH_KV_IPC_NAME", None)
    extra: tuple[str, ...] = ()
    if via == "env":
        env["WORKBENCH_KV_IPC_NAME"] = name
    else:
        extra = ("--ipc-name", name)
    proc = _serve(free_port(), env, *extra)
    try:
        line = proc.stdout.readline()
        assert "serving tiny" in line and f"kvctl limit {name}" in line, line
        info = control.read_segment(name)
        assert info is not None and info.owner_pid == proc.pid
        half = info.capacity // 2 // info.page_id_bytes * info.page_id_bytes
        r = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "limit", name,
                            str(half), "--json", "--wait", "10"], env=env, capture_output=True,
                           text=True, timeout=60)
        answer = json.loads(r.stdout)
        assert r.returncode == 0 and answer["acknowledged"], (r.stdout, r.stderr)
        assert control.read_segment(name).limit == half
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        proc.stdout.close()
    deadline = time.monotonic() + 10
    while control.read_segment(name) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert control.read_segment(name) is None  # a clean shutdown removes the segment
