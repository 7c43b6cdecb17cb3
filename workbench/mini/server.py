"""An OpenAI-compatible ``/v1/completions`` server for the mini engine, standard library only.

So it runs on a bare GPU host (torch + cuda-python, nothing else), HTTP is ``http.server`` with a
thread per connection; one :class:`EngineLoop` thread owns the engine and steps it whenever there
is work. Handlers talk to it through queues: a request goes in, tokens come back one by one.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` (``stream`` as
server-sent events, ``data: {...}`` then ``data: [DONE]``). Fields read: ``prompt`` (a string, a
list of token ids, or a one-element list of either), ``max_tokens`` (16), ``temperature`` (1.0, as
OpenAI; 0 = greedy), ``seed``, ``stream``, ``stream_options.include_usage`` and vLLM's
``stop_token_ids``; ``ignore_eos`` is accepted (there is no EOS token). Others are ignored.

Text <-> ids (the model has no tokenizer): a prompt string is UTF-8 encoded and each byte is one
token id (0..255); an output id ``t`` becomes the character ``chr(t % 256)`` (Latin-1), so every
token is exactly one character and streamed text concatenates to the non-streamed text.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from workbench.errors import ConfigError
from workbench.mini.engine import Engine, Seq


def encode(text: str) -> list[int]:
    """Prompt string -> token ids: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    """Token ids -> text: one Latin-1 character per id (``id % 256``)."""
    return "".join(chr(t % 256) for t in ids)


class EngineLoop(threading.Thread):
    """The one thread that touches the engine. ``submit`` returns a queue of token ids that ends
    with ``None`` (finished) or an Exception (rejected)."""

    def __init__(self, engine: Engine, idle_wait_s: float = 0.02):
        super().__init__(name="mini-engine", daemon=True)
        self.engine = engine
        self.inbox: queue.Queue = queue.Queue()
        self.idle_wait_s = idle_wait_s
        self._halt = threading.Event()
        self.error: BaseException | None = None

    def submit(self, prompt: list[int], max_tokens: int, **kw: Any) -> tuple[str, queue.Queue]:
        rid = f"cmpl-{uuid.uuid4().hex[:16]}"
        out: queue.Queue = queue.Queue()
        self.inbox.put(("add", rid, prompt, max_tokens, kw, out))
        return rid, out

    def cancel(self, rid: str) -> None:
        self.inbox.put(("cancel", rid))

    def stop(self) -> None:
        self._halt.set()
        self.inbox.put(("noop",))

    def _drain(self, block: bool) -> None:
        try:
            msg = self.inbox.get(timeout=self.idle_wait_s) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, msg: tuple) -> None:
        if msg[0] == "add":
            _, rid, prompt, max_tokens, kw, out = msg

            def on_token(seq: Seq, tok: int | None, out=out) -> None:
                out.put(tok if tok is not None else None)

            try:
                seq = self.engine.add_request(prompt, max_tokens, rid=rid, on_token=on_token,
                                              **kw)
                self._live[rid] = seq
            except ConfigError as err:
                out.put(err)
        elif msg[0] == "cancel":
            seq = self._live.pop(msg[1], None)
            if seq is not None:
                self.engine.abort(seq, "abort")

    def run(self) -> None:
        self._live: dict[str, Seq] = {}
        try:
            while not self._halt.is_set():
                self._drain(block=not self.engine.has_work())
                if self.engine.has_work():
                    for seq in self.engine.step():
                        self._live.pop(seq.name, None)
                    if not self.engine.scheduler.running:
                        time.sleep(self.idle_wait_s)  # waiting for memory another pool holds
        except BaseException as err:  # surface engine crashes to every open request
            self.error = err
            for seq in list(self._live.values()):
                if seq.on_token is not None:
                    seq.on_token(seq, None)
            raise


class _Handler(BaseHTTPRequestHandler):
    server: MiniHTTPServer
    protocol_version = "HTTP/1.0"  # one request per connection; SSE ends when we close

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet by default
        if self.server.verbose:
            super().log_message(fmt, *args)

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str, kind: str = "invalid_request_error") -> None:
        self._json(code, {"error": {"message": message, "type": kind, "code": code}})

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            ok = self.server.loop.is_alive()
            return self._json(200 if ok else 503, {"status": "ok" if ok else "dead"})
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [
                {"id": self.server.model_name, "object": "model", "owned_by": "workbench"}]})
        self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/v1/completions":
            return self._error(404, f"no route {self.path}")
        try:
            n = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(n) or b"{}")
            prompt, kw = self._parse(body)
        except (ValueError, TypeError, KeyError) as err:
            return self._error(400, str(err))
        loop = self.server.loop
        rid, out = loop.submit(prompt, **kw)
        created = int(time.time())
        stream = bool(body.get("stream", False))
        usage_on = bool((body.get("stream_options") or {}).get("include_usage", False))
        first = out.get()
        if isinstance(first, Exception):
            return self._error(400, str(first))
        tokens: list[int] = []

        def tokens_iter():
            tok = first
            while tok is not None:
                yield tok
                tok = out.get()

        def chunk(text: str, finish: str | None) -> dict:
            return {"id": rid, "object": "text_completion", "created": created,
                    "model": self.server.model_name,
                    "choices": [{"index": 0, "text": text, "logprobs": None,
                                 "finish_reason": finish}]}

        usage = lambda: {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),  # noqa: E731
                         "total_tokens": len(prompt) + len(tokens)}
        if not stream:
            tokens.extend(tokens_iter())
            body = chunk(decode(tokens), self._reason(len(tokens), kw["max_tokens"]))
            body["usage"] = usage()
            return self._json(200, body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            for tok in tokens_iter():
                tokens.append(tok)
                self._sse(chunk(decode([tok]), None))
            self._sse(chunk("", self._reason(len(tokens), kw["max_tokens"])))
            if usage_on:
                self._sse({"id": rid, "object": "text_completion", "created": created,
                           "model": self.server.model_name, "choices": [], "usage": usage()})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            loop.cancel(rid)  # the client went away: give its blocks back

    def _sse(self, obj: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    @staticmethod
    def _reason(n: int, max_tokens: int) -> str:
        return "length" if n >= max_tokens else "stop"

    def _parse(self, body: dict) -> tuple[list[int], dict]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = prompt
        else:
            raise ValueError("prompt must be a string or a list of token ids (one prompt "
                             "per request)")
        kw = {"max_tokens": int(body.get("max_tokens") or 16),
              "temperature": float(body.get("temperature", 1.0)),
              "seed": body.get("seed"),
              "stop_ids": [int(t) for t in body.get("stop_token_ids") or []]}
        return ids, kw


class MiniHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], loop: EngineLoop, model_name: str,
                 verbose: bool = False):
        super().__init__(addr, _Handler)
        self.loop = loop
        self.model_name = model_name
        self.verbose = verbose

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def start_server(engine: Engine, host: str = "127.0.0.1", port: int = 8000,
                 model_name: str | None = None, verbose: bool = False) -> MiniHTTPServer:
    """Start the engine loop and the HTTP server in background threads; ``shutdown_server`` ends
    both. ``port=0`` picks a free port (see ``server.url``)."""
    loop = EngineLoop(engine)
    loop.start()
    srv = MiniHTTPServer((host, port), loop, model_name or engine.model_cfg.name, verbose)
    threading.Thread(target=srv.serve_forever, name="mini-http", daemon=True).start()
    return srv


def shutdown_server(srv: MiniHTTPServer) -> None:
    srv.shutdown()
    srv.server_close()
    srv.loop.stop()
    srv.loop.join(timeout=5)
