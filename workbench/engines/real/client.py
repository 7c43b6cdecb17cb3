"""A streaming client for vLLM's OpenAI-compatible server: prompts go as token ids (lengths are
exact), every streamed chunk is timed on arrival, so TTFT, TPOT, ITL and end-to-end are the
client's view, queueing and HTTP included."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from workbench.engines.sched.request import ReqState, Request


@dataclass(slots=True)
class Sampling:
    """What the lab asks of each completion (greedy unless ``temperature`` > 0)."""

    temperature: float = 0.0
    seed: int | None = None  # a per-request sampling seed (seeded sampling is reproducible)
    ignore_eos: bool = True


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it."""

    token_ids: list[int] = field(default_factory=list)
    error: str = ""
    cached_tokens: int | None = None


def body(model: str, req: Request, sampling: Sampling) -> dict[str, Any]:
    b: dict[str, Any] = {"model": model, "prompt": list(req.prompt),
                         "max_tokens": req.max_new_tokens, "temperature": sampling.temperature,
                         "stream": True, "ignore_eos": sampling.ignore_eos,
                         "return_token_ids": True, "skip_special_tokens": False,
                         "stream_options": {"include_usage": True}}
    if sampling.seed is not None:
        b["seed"] = sampling.seed + req.rid
    return b


def stream_one(client, url: str, payload: dict[str, Any], on_chunk, req: Request, clock,
               out: Outcome) -> None:
    """POST one request and read its server-sent stream: each message goes to ``on_chunk(msg,
    req, now, out)``; fills ``req``'s timings and ``out`` (a failure is the outcome's error)."""
    req.state = ReqState.RUNNING
    try:
        with client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                resp.read()
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                on_chunk(json.loads(data), req, clock(), out)
        req.finish = clock()
        req.state = ReqState.FINISHED
        req.output_len = len(out.token_ids)
    except Exception as err:  # a lost request is a figure, not a crash of the run
        out.error = f"{type(err).__name__}: {err}"[:400]
        req.state = ReqState.REJECTED


def _chunk(msg: dict, req: Request, now: float, out: Outcome) -> None:
    usage = msg.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        out.cached_tokens = int(details["cached_tokens"])
    for choice in msg.get("choices") or []:
        ids = choice.get("token_ids") or []
        if not ids:
            continue
        if req.first_token is None:
            req.first_token = now
        out.token_ids.extend(int(t) for t in ids)
        req.token_times.extend([now] * len(ids))
        req.tokens.extend(int(t) for t in ids)


class Sender:
    """Sends each request at its arrival time (the engine's clock) from a thread of its own."""

    on_chunk = staticmethod(_chunk)  # what one streamed message adds to a request

    def payload(self, req: Request) -> dict[str, Any]:
        return body(self.model, req, self.sampling)

    def __init__(self, base_url: str, model: str, sampling: Sampling, clock,
                 timeout_s: float = 600.0):
        import httpx

        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model, self.sampling, self.clock = model, sampling, clock
        self.client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0),
                                   limits=httpx.Limits(max_connections=512))
        self.threads: list[threading.Thread] = []
        self.outcomes: dict[int, Outcome] = {}

    def send(self, req: Request) -> None:
        out = self.outcomes.setdefault(req.rid, Outcome())

        def go() -> None:
            delay = req.arrival - self.clock()
            if delay > 0:
                time.sleep(delay)
            stream_one(self.client, self.url, self.payload(req), self.on_chunk, req, self.clock,
                       out)

        t = threading.Thread(target=go, daemon=True, name=f"req-{req.rid}")
        self.threads.append(t)
        t.start()

    def busy(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def wait(self, until_clock: float | None) -> None:
        for t in self.threads:
            left = None if until_clock is None else max(0.0, until_clock - self.clock())
            t.join(left)

    def close(self) -> None:
        self.client.close()
