"""The mini server as OpenAI's own Python client and Prometheus' parser see it, beside vLLM:
completions plain and streamed, the model list, an unknown model (404) and unsupported fields
(400) in OpenAI's error shape, /health, /version, and /metrics' latency histograms."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from workbench import __version__  # noqa: E402
from workbench.mini.engine import Engine  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import get_config  # noqa: E402
from workbench.mini.server import shutdown_server, start_server  # noqa: E402

HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
              "vllm:e2e_request_latency_seconds")


@pytest.fixture(scope="module")
def server():
    eng = Engine(get_config("tiny"), KVSpec(kv_bytes=8 << 20))
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


def test_models_and_completions_plain_and_streamed(client):
    (model,) = client.models.list().data
    assert model.id == "tiny" and model.object == "model"
    plain = client.completions.create(model="tiny", prompt="hello", max_tokens=8,
                                      temperature=0)
    assert plain.object == "text_completion" and plain.model == "tiny"
    assert len(plain.choices[0].text) == 8 and plain.choices[0].finish_reason == "length"
    assert plain.usage.completion_tokens == 8 and plain.usage.prompt_tokens == 5
    chunks = list(client.completions.create(model="tiny", prompt="hello", max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_unknown_model_is_a_404_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    err = e.value.body
    assert e.value.status_code == 404
    assert err["param"] == "model" and err["code"] == 404 and err["type"] == "NotFoundError"
    assert "tiny" in err["message"]


@pytest.mark.parametrize("field,value", [("logprobs", 1), ("echo", True), ("best_of", 2),
                                         ("suffix", "x"), ("top_p", 0.5),
                                         ("frequency_penalty", 0.5)])
def test_unsupported_fields_are_a_400_naming_them(client, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, **{field: value})
    assert e.value.body["param"] == field and "not supported" in e.value.body["message"]


def test_neutral_values_of_unsupported_fields_are_accepted(client):
    r = client.completions.create(model="tiny", prompt="hi", max_tokens=2, echo=False,
                                  logprobs=None, best_of=1, top_p=1.0, frequency_penalty=0,
                                  presence_penalty=0)
    assert len(r.choices[0].text) == 2


def test_health_and_version(server):
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    assert httpx.get(server.url + "/version", timeout=10).json() == {"version": __version__}


def test_metrics_latency_histograms_4xx_counted_no_created(server, client):
    client.completions.create(model="tiny", prompt="abc", max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="abc", max_tokens=4)
    assert httpx.get(server.url + "/no-such-page", timeout=10).status_code == 404
    fams = _families(server)
    for name in HISTOGRAMS:
        fam = fams[name.removesuffix("_seconds") + "_seconds"]
        assert fam.type == "histogram", name
        counts = [s for s in fam.samples if s.name == name + "_count"]
        assert counts and all(s.labels == {"model_name": "tiny"} for s in counts), counts
        assert counts[0].value >= 1
        buckets = [s for s in fam.samples if s.name == name + "_bucket"]
        assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == counts[0].value
    codes = {s.labels["code"]: s.value for s in fams["workbench_server_responses"].samples}
    assert codes.get("404", 0) >= 2 and codes.get("200", 0) >= 1
    every = [s.name for f in fams.values() for s in f.samples]
    assert not [n for n in every if n.endswith("_created")]
