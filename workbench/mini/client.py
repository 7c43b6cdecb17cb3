"""A load client for any OpenAI-compatible ``/v1/completions`` server (the mini engine's,
``vllm serve``, SGLang's), so labs drive all three the same way. Async on httpx, one event loop
for a whole workload (no thread per request), the stream read as server-sent events by httpx-sse.

Each request streams and records time to first token, the arrival time of every later chunk and
the end. Token counts come from ``usage`` when the server sends it (``include_usage``), else from
the number of non-empty text chunks (vLLM and the mini server send one chunk per token).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from httpx_sse import aconnect_sse

from workbench.percentiles import percentile  # noqa: F401 - the load client's percentile

T = TypeVar("T")


@dataclass
class Result:
    ok: bool
    text: str = ""
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # seconds since the request was sent
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    sent_at: float = 0.0  # perf_counter when sent
    status: int | None = None  # HTTP status, when the server answered
    retry_after_s: float | None = None  # a 503's Retry-After: the server was full

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if self.ttft_s is None or self.e2e_s is None or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to the end from synchronous code, also where an event loop already runs in
    this thread (a notebook): then on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: list = []
    t = threading.Thread(target=lambda: box.append(asyncio.run(coro)), daemon=True)
    t.start()
    t.join()
    return box[0]


def get_model_name(base_url: str, timeout: float = 10.0) -> str:
    """The first model the server lists (vLLM and SGLang check the ``model`` field)."""
    r = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=timeout)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def _body(prompt: str | Sequence[int], max_tokens: int, model: str | None, temperature: float,
          stream: bool, extra: dict | None) -> dict:
    body: dict[str, Any] = {"prompt": prompt if isinstance(prompt, str) else list(prompt),
                            "max_tokens": max_tokens, "temperature": temperature,
                            "stream": stream}
    if model is not None:  # else the server's own model
        body["model"] = model
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra or {})
    return body


def _refused(res: Result, resp: httpx.Response) -> None:
    """OpenAI-style error bodies (``{"error": {"message": ...}}``) give the message."""
    res.status = resp.status_code
    after = resp.headers.get("Retry-After")
    res.retry_after_s = float(after) if after and after.replace(".", "", 1).isdigit() else None
    try:
        message = resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = resp.reason_phrase
    res.error = f"HTTP {resp.status_code}: {message}"


def _plain(res: Result, data: dict, t0: float) -> None:
    res.e2e_s = res.ttft_s = time.perf_counter() - t0
    ch = data["choices"][0]
    res.text, res.finish_reason = ch["text"], ch.get("finish_reason")
    usage = data.get("usage") or {}
    res.completion_tokens = usage.get("completion_tokens", len(res.text))
    res.prompt_tokens = usage.get("prompt_tokens")
    res.ok = True


def _event(res: Result, obj: dict, now: float, parts: list[str]) -> None:
    """One ``data:`` event of a stream: text, usage and the finish reason."""
    if obj.get("usage"):
        res.completion_tokens = obj["usage"].get("completion_tokens", 0)
        res.prompt_tokens = obj["usage"].get("prompt_tokens")
    for ch in obj.get("choices") or []:
        if ch.get("text"):
            parts.append(ch["text"])
            res.chunk_times.append(now)
            if res.ttft_s is None:
                res.ttft_s = now
        if ch.get("finish_reason"):
            res.finish_reason = ch["finish_reason"]


async def acomplete(client: httpx.AsyncClient, base_url: str, prompt: str | Sequence[int],
                    max_tokens: int, *, model: str | None = None, temperature: float = 0.0,
                    stream: bool = True, extra: dict | None = None) -> Result:
    """One completion on ``client``; a failure is recorded in the Result, never raised."""
    url = base_url.rstrip("/") + "/v1/completions"
    body = _body(prompt, max_tokens, model, temperature, stream, extra)
    t0 = time.perf_counter()
    res = Result(ok=False, sent_at=t0)
    try:
        if not stream:
            resp = await client.post(url, json=body)
            if resp.is_error:
                _refused(res, resp)
            else:
                res.status = resp.status_code
                _plain(res, resp.json(), t0)
            return res
        parts: list[str] = []
        async with aconnect_sse(client, "POST", url, json=body) as source:
            resp = source.response
            if resp.is_error:
                await resp.aread()
                _refused(res, resp)
                return res
            res.status = resp.status_code
            async for sse in source.aiter_sse():
                if sse.data == "[DONE]":
                    break
                _event(res, json.loads(sse.data), time.perf_counter() - t0, parts)
        res.text = "".join(parts)
        res.completion_tokens = res.completion_tokens or len(res.chunk_times)
        res.ok = True
    except Exception as err:  # noqa: BLE001 - a load client records failures, it does not stop
        res.error = f"{type(err).__name__}: {err}"
    finally:
        res.e2e_s = res.e2e_s if res.e2e_s is not None else time.perf_counter() - t0
    return res


def _client(timeout: float, connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=min(timeout, 30.0)),
                             limits=httpx.Limits(max_connections=connections,
                                                 max_keepalive_connections=connections))


def complete(base_url: str, prompt: str | Sequence[int], max_tokens: int, *,
             model: str | None = None, temperature: float = 0.0, stream: bool = True,
             timeout: float = 600.0, extra: dict | None = None) -> Result:
    """One completion; ``extra`` adds server-specific fields (``ignore_eos`` for vLLM/SGLang)."""
    async def one() -> Result:
        async with _client(timeout, 1) as client:
            return await acomplete(client, base_url, prompt, max_tokens, model=model,
                                   temperature=temperature, stream=stream, extra=extra)

    return _run(one())


@dataclass
class Timed:
    """A request of a workload: send ``at`` seconds after the start."""

    at: float
    prompt: str | list[int]
    max_tokens: int
    tag: str = ""


async def arun_workload(base_url: str, requests: Sequence[Timed], *, model: str | None = None,
                        temperature: float = 0.0, extra: dict | None = None,
                        timeout: float = 600.0) -> list[Result]:
    """Send each request at its time (open loop, one task each) and wait for all of them."""
    async with _client(timeout, max(1, len(requests))) as client:
        if model is None:
            r = await client.get(base_url.rstrip("/") + "/v1/models")
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        start = time.perf_counter()

        async def one(r: Timed) -> Result:
            await asyncio.sleep(max(0.0, start + r.at - time.perf_counter()))
            return await acomplete(client, base_url, r.prompt, r.max_tokens, model=model,
                                   temperature=temperature, extra=extra)

        return list(await asyncio.gather(*(one(r) for r in requests)))


def run_workload(base_url: str, requests: Sequence[Timed], *, model: str | None = None,
                 temperature: float = 0.0, extra: dict | None = None,
                 timeout: float = 600.0) -> list[Result]:
    """:func:`arun_workload` from synchronous code."""
    return _run(arun_workload(base_url, requests, model=model, temperature=temperature,
                              extra=extra, timeout=timeout))
