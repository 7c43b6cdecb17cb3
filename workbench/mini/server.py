"""An OpenAI-compatible ``/v1/completions`` server for the mini engine: FastAPI on uvicorn, as
vLLM's and SGLang's servers are built.

One :class:`~workbench.mini.loop.EngineLoop` thread owns the engine; uvicorn's event loop (its own
thread) parses, validates and admits requests and streams tokens back. Endpoints: ``GET /health``,
``GET /version``, ``GET /v1/models`` and ``/v1/models/{id}``, ``GET /metrics`` (Prometheus, under
vLLM's names), ``POST /v1/completions`` and ``POST /v1/chat/completions`` (a small chat template
over the byte tokenizer; ``stream`` as server-sent events, ``data: {...}`` then ``data: [DONE]``),
and ``POST /reset_prefix_cache`` (vLLM; ``/flush_cache`` as SGLang names it). The body is the
pydantic model in :mod:`workbench.mini.protocol`: a bad field gets a 400 whose ``error.param``
names it, a field this server does not implement (``logprobs``, ``echo``, ...) a 400 too, and a
``model`` it does not serve a 404, in OpenAI's error shape as vLLM answers.

Overload is refused, not queued without end: at most ``queue_capacity`` requests are admitted at
once (waiting or running); one more gets 503 with ``Retry-After``. A body must arrive within
``body_timeout_s`` (408) and be at most ``max_body_bytes`` (413). See docs/server.md.

Text <-> ids (the model has no tokenizer): a prompt string is UTF-8 encoded and each byte is one
token id (0..255); an output id ``t`` becomes the character ``chr(t % 256)`` (Latin-1), so every
token is exactly one character and streamed text concatenates to the non-streamed text.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from workbench.mini.engine import Engine
from workbench.mini.loop import EngineLoop, EngineStopped
from workbench.mini.metrics import ServerMetrics
from workbench.mini.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    SamplingRequest,
    StopMatcher,
    check_against_model,
    decode,
    encode,
    parse_request,
)
from workbench.units import MiB

__all__ = ["ServerConfig", "MiniServer", "start_server", "shutdown_server", "encode", "decode"]


@dataclass(slots=True)
class ServerConfig:
    queue_capacity: int = 256  # requests admitted at once (waiting + running); more get 503
    retry_after_s: int = 1
    body_timeout_s: float = 10.0  # the whole body must arrive within this
    max_body_bytes: int = MiB
    backlog: int = 2048  # pending TCP connections the kernel keeps before uvicorn accepts them
    max_connections: int = 1024  # open connections + tasks; past it uvicorn answers 503 itself
    verbose: bool = False


@dataclass(slots=True)
class _State:
    loop: EngineLoop
    model_name: str
    cfg: ServerConfig
    metrics: ServerMetrics
    admitted: int = 0  # only the event loop's thread changes it


class _TokenStream:
    """Engine thread -> event loop: each sink call becomes a queue item on the event loop."""

    def __init__(self, state: _State):
        self.state = state
        self.aloop = asyncio.get_running_loop()
        self.q: asyncio.Queue = asyncio.Queue()

    def sink(self, item: Any) -> None:  # runs on the engine thread
        try:
            self.aloop.call_soon_threadsafe(self._arrive, item)
        except RuntimeError:
            pass  # the event loop is closed: the server is gone, nobody is listening

    def _arrive(self, item: Any) -> None:
        if item is None or isinstance(item, BaseException):
            self.state.admitted -= 1  # every request ends here exactly once
        elif isinstance(item, int):
            self.state.metrics.generated.inc()
        self.q.put_nowait(item)

    async def get(self) -> Any:
        while True:  # wake now and then: an engine that died mid-request says nothing more
            try:
                return await asyncio.wait_for(self.q.get(), 1.0)
            except asyncio.TimeoutError:
                if not self.state.loop.is_alive():
                    return EngineStopped("the engine stopped; restart `workbench serve`")


async def _read_body(request: Request, cfg: ServerConfig) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cfg.max_body_bytes:
        raise ApiError(413, f"body: {declared} bytes exceeds the limit of {cfg.max_body_bytes}",
                       "body")

    async def collect() -> bytes:
        parts, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cfg.max_body_bytes:
                raise ApiError(413, f"body: exceeds the limit of {cfg.max_body_bytes} bytes",
                               "body")
            parts.append(chunk)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(collect(), cfg.body_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"body: not received in full within {cfg.body_timeout_s:g} s "
                       "(is Content-Length right?)", "body") from None
    except ClientDisconnect:
        raise ApiError(400, "body: the client closed the connection mid-body", "body") from None


class _HungUp(Exception):
    """The client closed its connection before its answer was ready."""


async def _hung_up(request: Request) -> None:
    """Return once the client hangs up: after the body, the next ASGI message is the
    disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(work: Any, gone: asyncio.Future, loop: EngineLoop, rid: str) -> Any:
    """``work``'s result, or, when the client hangs up first, the request cancelled in the
    engine (its blocks freed) and :class:`_HungUp`."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    loop.cancel(rid)
    raise _HungUp


def _as_api_error(err: BaseException) -> ApiError:
    """The engine's refusal of one request is the client's 400; a stopped engine is a 503."""
    if isinstance(err, ApiError):
        return err
    if isinstance(err, EngineStopped):
        return ApiError(503, str(err), kind="server_error")
    return ApiError(400, str(err))


class _Shape:
    """How an endpoint writes its answer: ``/v1/completions``' ``text_completion`` objects."""

    prefix, obj, chunk_obj = "", "text_completion", "text_completion"  # ids: cmpl-...

    def choice(self, text: str, finish: str | None, first: bool) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def whole(self, text: str, finish: str | None) -> dict:
        return self.choice(text, finish, True)

    def body(self, rid: str, created: int, model: str, obj: str, choices: list) -> dict:
        return {"id": self.prefix + rid, "object": obj, "created": created,
                "model": model, "choices": choices}


class _ChatShape(_Shape):
    """``/v1/chat/completions``: a message, or deltas whose first names the role."""

    prefix, obj, chunk_obj = "chat", "chat.completion", "chat.completion.chunk"  # chatcmpl-...

    def choice(self, text: str, finish: str | None, first: bool) -> dict:
        delta = {"role": "assistant", "content": text} if first else \
            ({"content": text} if text else {})
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def whole(self, text: str, finish: str | None) -> dict:
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": finish}


COMPLETION, CHAT = _Shape(), _ChatShape()


async def _pieces(stream: _TokenStream, first: Any, req: SamplingRequest, rid: str,
                  n_tokens: list[int]) -> AsyncIterator[tuple[str, str | None]]:
    """(text, None) per piece of output, then ("", finish_reason) once; stop strings applied."""
    stops = StopMatcher(req.stop_strings())
    item = first
    while item is not None:
        if isinstance(item, BaseException):
            raise _as_api_error(item)
        n_tokens[0] += 1
        text, hit = stops.feed(decode([item]))
        if text:
            yield text, None
        if hit:
            stream.state.loop.cancel(rid)  # the engine frees its blocks; ends with None
            yield "", "stop"
            return
        item = await stream.get()
    if tail := stops.flush():
        yield tail, None
    yield "", "length" if n_tokens[0] >= req.max_tokens else "stop"


def _unknown_model(name: str, served: str, param: str | None = "model") -> ApiError:
    return ApiError(404, f"model {name!r}: not served here; this server serves {served!r} "
                    "(GET /v1/models)", param, kind="NotFoundError")


async def _answer(request: Request, kind: type, shape: _Shape) -> Response:
    st: _State = request.app.state.mini
    arrived = time.perf_counter()
    req = parse_request(await _read_body(request, st.cfg), kind)
    if req.model is not None and req.model != st.model_name:
        raise _unknown_model(req.model, st.model_name)
    ids = req.prompt_ids()
    eng = st.loop.engine
    g = eng.kv.geometry
    check_against_model(req, ids, eng.model_cfg.vocab_size, eng.model_cfg.max_position,
                        (g.num_blocks - 1) * g.block_size)
    if not st.loop.is_alive():
        raise ApiError(503, "the engine stopped; restart `workbench serve`", kind="server_error")
    if st.admitted >= st.cfg.queue_capacity:
        st.metrics.rejected.inc()
        raise ApiError(503, f"server busy: {st.admitted} requests in flight (capacity "
                       f"{st.cfg.queue_capacity}); retry after {st.cfg.retry_after_s} s",
                       kind="overloaded")
    stream = _TokenStream(st)
    st.admitted += 1
    rid = st.loop.submit(ids, req.max_tokens, stream.sink, temperature=req.sampling_temperature(),
                         seed=req.seed, stop_ids=list(req.stop_token_ids or []))
    gone = asyncio.ensure_future(_hung_up(request))
    try:  # until a response streams, a client that hangs up cancels its request (and its KV)
        first = await _unless_gone(stream.get(), gone, st.loop, rid)
        if isinstance(first, BaseException):
            raise _as_api_error(first)
        ttft = time.perf_counter() - arrived
        st.metrics.prompted.inc(len(ids))
        created, n_tokens = int(time.time()), [0]
        done_timing = lambda finish: st.metrics.finished(  # noqa: E731
            ttft, time.perf_counter() - arrived, n_tokens[0], finish or "stop")
        usage = lambda: {"prompt_tokens": len(ids),  # noqa: E731
                         "completion_tokens": n_tokens[0], "total_tokens": len(ids) + n_tokens[0]}
        if not req.stream:
            async def collect() -> tuple[list[str], str | None]:
                text, finish = [], None
                async for piece, finish in _pieces(stream, first, req, rid, n_tokens):  # noqa: B007
                    text.append(piece)
                return text, finish

            text, finish = await _unless_gone(collect(), gone, st.loop, rid)
            done_timing(finish)
            body = shape.body(rid, created, st.model_name, shape.obj,
                              [shape.whole("".join(text), finish)])
            body["usage"] = usage()
            return JSONResponse(body)
    except _HungUp:
        return Response(status_code=499)  # nobody reads it: the request was cancelled
    finally:
        gone.cancel()  # a streamed response watches for the hang-up itself

    async def events() -> AsyncIterator[bytes]:
        done, opening = False, True
        try:
            async for piece, finish in _pieces(stream, first, req, rid, n_tokens):
                if piece or finish:
                    yield _sse(shape.body(rid, created, st.model_name, shape.chunk_obj,
                                          [shape.choice(piece, finish, opening)]))
                    opening = False
                if finish:
                    done_timing(finish)
            if req.stream_options and req.stream_options.include_usage:
                yield _sse({**shape.body(rid, created, st.model_name, shape.chunk_obj, []),
                            "usage": usage()})
            done = True
            yield b"data: [DONE]\n\n"
        except ApiError as err:  # the engine stopped mid-stream: say so in the stream
            yield _sse(err.body())
        finally:
            if not done:
                st.loop.cancel(rid)  # the client went away: give its blocks back

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def build_app(loop: EngineLoop, model_name: str, cfg: ServerConfig) -> FastAPI:
    app = FastAPI(title="workbench mini engine", docs_url=None, redoc_url=None,
                  openapi_url=None)
    metrics = ServerMetrics(lambda: loop.gauges, lambda: st.admitted, cfg.queue_capacity,
                            model_name)
    started = int(time.time())
    st = _State(loop, model_name, cfg, metrics)
    app.state.mini = st

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        headers = {"Retry-After": str(cfg.retry_after_s)} if err.status == 503 else None
        metrics.answered(err.status)
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
        metrics.answered(err.status_code)
        return JSONResponse(ApiError(err.status_code, f"{request.url.path}: {err.detail}").body(),
                            status_code=err.status_code)

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = loop.is_alive()
        return JSONResponse({"status": "ok" if ok else "dead"}, status_code=200 if ok else 503)

    @app.get("/version")
    async def version() -> dict:
        from workbench import __version__

        return {"version": __version__}

    def card() -> dict:
        return {"id": model_name, "object": "model", "created": started,
                "owned_by": "workbench", "root": model_name, "parent": None,
                "max_model_len": loop.engine.model_cfg.max_position}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        if model_id != model_name:
            raise _unknown_model(model_id, model_name, None)
        return card()

    @app.get("/metrics")
    async def metrics_page() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        resp = await _answer(request, CompletionRequest, COMPLETION)
        metrics.answered(resp.status_code)
        return resp

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        resp = await _answer(request, ChatRequest, CHAT)
        metrics.answered(resp.status_code)
        return resp

    async def reset() -> JSONResponse:
        """Drop every cached block no request holds (vLLM's /reset_prefix_cache, SGLang's
        /flush_cache): their pages can go back to the pool."""
        if not loop.is_alive():
            raise ApiError(503, "the engine stopped; restart `workbench serve`",
                           kind="server_error")
        freed = await asyncio.wrap_future(loop.call(lambda e: e.pool.reset_prefix_cache()))
        metrics.answered(200)
        return JSONResponse({"status": "ok", "evicted_blocks": freed})

    app.add_api_route("/reset_prefix_cache", reset, methods=["POST"])
    app.add_api_route("/flush_cache", reset, methods=["POST"])

    return app


@dataclass(slots=True)
class MiniServer:
    """A running server: ``url`` to reach it, ``shutdown_server`` to end it."""

    loop: EngineLoop
    app: FastAPI
    uv: Any  # uvicorn.Server
    thread: threading.Thread
    host: str
    port: int
    cfg: ServerConfig = field(default_factory=ServerConfig)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def start_server(engine: Engine, host: str = "127.0.0.1", port: int = 8000,
                 model_name: str | None = None, verbose: bool = False,
                 config: ServerConfig | None = None) -> MiniServer:
    """Start the engine loop and uvicorn in background threads; ``shutdown_server`` ends both.
    ``port=0`` picks a free port (see ``server.url``)."""
    from workbench.observe.asgi import serve_in_thread

    cfg = config or ServerConfig(verbose=verbose)
    cfg.verbose = cfg.verbose or verbose
    loop = EngineLoop(engine)
    loop.start()
    app = build_app(loop, model_name or engine.model_cfg.name, cfg)
    try:
        uv, thread, bound = serve_in_thread(app, host, port, cfg.backlog, cfg.verbose,
                                            max_connections=cfg.max_connections)
    except BaseException:
        loop.stop()
        loop.join(timeout=5)
        raise
    return MiniServer(loop, app, uv, thread, host, bound, cfg)


def shutdown_server(srv: MiniServer) -> None:
    srv.uv.should_exit = True
    srv.thread.join(timeout=10)
    srv.loop.stop()
    srv.loop.join(timeout=5)
