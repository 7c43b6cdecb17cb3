"""The ``sglang`` kind over a stand-in server (no SGLang needed): the Engine protocol, streamed
``/generate`` timings and token ids, the pool's control segment, and nothing left after close."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from workbench.engines.base import Engine, PoolView
from workbench.engines.real.client import Sampling
from workbench.engines.real.procs import descendants
from workbench.engines.real.sglang import (
    SglangEngine,
    SglangSpec,
    body,
    new_ids,
    tiny_llama_config,
)
from workbench.engines.sched.request import Request
from workbench.errors import ConfigError

from .test_vllm_kind import _gone

HERE = Path(__file__).parent
FAKE = [sys.executable, str(HERE / "fake_sglang_server.py")]


def test_a_run_through_the_protocol_and_nothing_left_after_close():
    eng = SglangEngine("sg", SglangSpec(model="fake", server_cmd=FAKE, startup_timeout_s=60))
    with eng:
        assert isinstance(eng, Engine) and isinstance(eng.kv_pool, PoolView)
        assert eng.kind == "sglang"
        eng.submit([Request(rid=i, prompt=[10 * i, 7], max_new_tokens=5, arrival=0.05 * i)
                    for i in range(4)])
        eng.advance()
        assert not eng.has_work()
        m = eng.metrics()
        assert (m.requests, m.finished) == (4, 4)
        assert m.ttft.p50 > 0 and m.tpot.p50 > 0 and m.e2e.p50 >= m.ttft.p50
        assert [eng.outcome(i).token_ids for i in range(4)] == [[7, 8, 9, 10, 11]] * 4
        assert eng.outcome(0).cached_tokens == 0
        pids = [eng.process.pid, *descendants(eng.process.pid)]
        assert len(pids) >= 2  # the server and its pool's process
        folder, ipc = str(eng.dir), eng.ipc_name
    _gone(pids, folder, ipc)


def test_new_ids_reads_whole_and_incremental_streams_alike():
    whole = [{"output_ids": [5], "meta_info": {"completion_tokens": 1}},
             {"output_ids": [5, 6, 7], "meta_info": {"completion_tokens": 3}}]
    step = [{"output_ids": [5], "meta_info": {"completion_tokens": 1}},
            {"output_ids": [6, 7], "meta_info": {"completion_tokens": 3}}]
    # a whole list serialized after its count: it already holds the next token
    ahead = [{"output_ids": [5, 6], "meta_info": {"completion_tokens": 1}},
             {"output_ids": [5, 6, 7], "meta_info": {"completion_tokens": 3}}]
    for stream in (whole, step, ahead):
        got: list[int] = []
        for msg in stream:
            got += new_ids(msg, len(got))
        assert got == [5, 6, 7]


def test_the_request_body_is_token_ids_with_a_per_request_seed():
    b = body(Request(rid=3, prompt=[1, 2], max_new_tokens=4), Sampling(temperature=0.7, seed=10))
    assert b == {"input_ids": [1, 2], "stream": True, "sampling_params": {
        "max_new_tokens": 4, "temperature": 0.7, "ignore_eos": True, "sampling_seed": 13}}


def test_the_server_flags_and_the_tiny_model(tmp_path):
    spec = SglangSpec(model="m", max_total_tokens=4096, page_size=16, radix_cache=False)
    a = spec.args(1234, "e0")
    assert a[a.index("--port") + 1] == "1234" and a[a.index("--page-size") + 1] == "16"
    assert {"--skip-tokenizer-init", "--disable-radix-cache"} <= set(a)
    assert a[a.index("--attention-backend") + 1] == "triton"
    cfg = json.loads((tiny_llama_config(tmp_path) / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["head_dim"] == 128


def test_refuses_the_cpu_in_one_line():
    eng = SglangEngine("cpu", SglangSpec(model="m", device="cpu", server_cmd=FAKE))
    with pytest.raises(ConfigError, match="CUDA server only"):
        eng.launch()
