"""A load client for any OpenAI-compatible ``/v1/completions`` server (the mini engine's,
``vllm serve``, SGLang's), standard library only, so labs drive all three the same way.

Each request streams (SSE) and records time to first token, the arrival time of every later chunk
and the end. Token counts come from ``usage`` when the server sends it (``include_usage``), else
from the number of non-empty text chunks (vLLM and the mini server send one chunk per token).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field


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


def _post(url: str, body: dict, timeout: float):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    return urllib.request.urlopen(req, timeout=timeout)


def get_model_name(base_url: str, timeout: float = 10.0) -> str:
    """The first model the server lists (vLLM and SGLang check the ``model`` field)."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=timeout) as r:
        return json.loads(r.read())["data"][0]["id"]


def complete(base_url: str, prompt: str | Sequence[int], max_tokens: int, *,
             model: str | None = None, temperature: float = 0.0, stream: bool = True,
             timeout: float = 600.0, extra: dict | None = None) -> Result:
    """One completion; ``extra`` adds server-specific fields (``ignore_eos`` for vLLM/SGLang)."""
    body = {"model": model, "prompt": prompt if isinstance(prompt, str)
            else list(prompt), "max_tokens": max_tokens, "temperature": temperature,
            "stream": stream}
    if model is None:
        del body["model"]  # the server's own model (the mini server checks a name it is given)
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra or {})
    url = base_url.rstrip("/") + "/v1/completions"
    t0 = time.perf_counter()
    res = Result(ok=False, sent_at=t0)
    try:
        with _post(url, body, timeout) as resp:
            res.status = resp.status
            if not stream:
                data = json.loads(resp.read())
                res.e2e_s = res.ttft_s = time.perf_counter() - t0
                ch = data["choices"][0]
                res.text, res.finish_reason = ch["text"], ch.get("finish_reason")
                usage = data.get("usage") or {}
                res.completion_tokens = usage.get("completion_tokens", len(res.text))
                res.prompt_tokens = usage.get("prompt_tokens")
                res.ok = True
                return res
            parts: list[str] = []
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                obj = json.loads(payload)
                now = time.perf_counter() - t0
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
            res.e2e_s = time.perf_counter() - t0
            res.text = "".join(parts)
            res.completion_tokens = res.completion_tokens or len(res.chunk_times)
            res.ok = True
    except urllib.error.HTTPError as err:  # the server refused: keep its status and message
        _refused(res, err)
        res.e2e_s = time.perf_counter() - t0
    except Exception as err:  # noqa: BLE001 - a load client records failures, it does not stop
        res.error = f"{type(err).__name__}: {err}"
        res.e2e_s = time.perf_counter() - t0
    return res


def _refused(res: Result, err: urllib.error.HTTPError) -> None:
    """OpenAI-style error bodies (``{"error": {"message": ...}}``) give the message."""
    res.status = err.code
    after = err.headers.get("Retry-After") if err.headers else None
    res.retry_after_s = float(after) if after and after.replace(".", "", 1).isdigit() else None
    try:
        message = json.loads(err.read())["error"]["message"]
    except (ValueError, KeyError, TypeError, OSError):
        message = err.reason
    res.error = f"HTTP {err.code}: {message}"


@dataclass
class Timed:
    """A request of a workload: send ``at`` seconds after the start."""

    at: float
    prompt: str | list[int]
    max_tokens: int
    tag: str = ""


def run_workload(base_url: str, requests: Sequence[Timed], *, model: str | None = None,
                 temperature: float = 0.0, extra: dict | None = None,
                 timeout: float = 600.0) -> list[Result]:
    """Send each request at its time (one thread each, open loop) and wait for all of them."""
    model = model or get_model_name(base_url)
    results: list[Result | None] = [None] * len(requests)
    start = time.perf_counter()

    def one(i: int, r: Timed) -> None:
        delay = start + r.at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        results[i] = complete(base_url, r.prompt, r.max_tokens, model=model,
                              temperature=temperature, extra=extra, timeout=timeout)

    threads = [threading.Thread(target=one, args=(i, r), daemon=True)
               for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r if r is not None else Result(ok=False, error="not run") for r in results]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in 0..100 (numpy's default), no numpy needed."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
