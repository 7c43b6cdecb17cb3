"""Running an ASGI app (the mini server, the pool exporter) on uvicorn, on a socket bound first.

Binding before uvicorn starts means ``port=0`` works (the caller learns the port at once) and a
port in use is a one-line :class:`~workbench.errors.ConfigError`, not a traceback. uvicorn's h11
protocol is used: the pure-Python one, so every host behaves the same.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from workbench.errors import ConfigError


def bind_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    if not 0 <= port <= 65535:
        raise ConfigError(f"port {port}", "is outside 0..65535", "pick a port in 1..65535, or 0")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=backlog)
    except OSError as err:
        raise ConfigError(f"{host}:{port}", f"cannot listen there ({err.strerror})",
                          "pick another port (0 picks a free one) or address") from None


def make_server(app: Any, verbose: bool = False, max_connections: int | None = None,
                header_timeout_s: float = 10.0, per_client: int | None = None) -> Any:
    """uvicorn has no timeout for a request's headers (only keep-alive between requests): a
    connection whose request headers are not complete within ``header_timeout_s`` of its start
    (or of its previous response) is closed, and one address holds at most ``per_client``
    connections (more are closed at once), so a client that opens many and sends half a header
    keeps nobody else out. ``max_connections`` is the global cap (past it uvicorn answers 503);
    apps time their own body reads."""
    import uvicorn

    cfg = uvicorn.Config(app, http=guarded_h11(header_timeout_s, per_client), lifespan="off",
                         log_level="info" if verbose else "warning", access_log=verbose,
                         timeout_keep_alive=5, timeout_graceful_shutdown=3,
                         limit_concurrency=max_connections)
    return uvicorn.Server(cfg)


def guarded_h11(header_timeout_s: float, per_client: int | None) -> type:
    """uvicorn's h11 protocol with a header deadline and a per-address connection cap (one
    table per server: the class is made per call). A new connection from an address at its cap
    takes the place of that address's oldest connection still waiting for request headers; it is
    refused only when all of them are mid-request. So a client holding its address's share
    (every local client shares 127.0.0.1 with a loopback scraper) delays nobody: a scrape, which
    sends its headers at once, evicts an idle holder instead of being turned away for good."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    held: dict[str, list[Any]] = {}
    framed = strict_framing()

    class Guarded(H11Protocol):
        _timer: Any = None
        _peer: str | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn.__class__ = framed  # the same connection, its requests' framing checked

        def send_400_response(self, msg: str) -> None:
            """A framing error as an OpenAI-style JSON body naming it (uvicorn's is plain
            text), then the connection closed: nothing behind it is read."""
            import json

            from workbench.mini.protocol import ApiError

            why = getattr(self.conn, "why", None) or msg
            body = json.dumps(ApiError(400, f"malformed HTTP request: {why}",
                                       kind="invalid_request_error").body()).encode()
            for event in (h11.Response(status_code=400, reason=b"Bad Request",
                                       headers=[(b"content-type", b"application/json"),
                                                (b"content-length", str(len(body)).encode()),
                                                (b"connection", b"close")]),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
            mine = held.setdefault(self._peer, [])
            if per_client is not None and len(mine) >= per_client:
                idle = next((c for c in mine if c.waiting()), None)
                if idle is None:
                    self._peer = None
                    transport.close()  # every connection of this address is mid-request
                    return
                idle.evict()
            mine.append(self)
            self._arm()

        def waiting(self) -> bool:
            """Still without complete request headers (new, or kept alive between requests)."""
            return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

        def evict(self) -> None:
            self._forget()
            self.transport.close()

        def _forget(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            mine = held.get(self._peer or "", [])
            if self in mine:
                mine.remove(self)
                if not mine:
                    del held[self._peer]
            self._peer = None

        def _arm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _headers_late(self) -> None:
            self._timer = None
            if self.waiting():
                self.transport.close()  # still no complete request headers

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._timer is not None and self.conn.their_state is not h11.IDLE:
                self._timer.cancel()  # the headers are in: the app times the body
                self._timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self._peer is not None:
                self._arm()  # the next request's headers have the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._forget()
            super().connection_lost(exc)

    return Guarded


def strict_framing() -> type:
    """h11's connection, refusing a request that gives both Content-Length and
    Transfer-Encoding (RFC 9112 6.1: a front end that reads the other length would see a second
    request smuggled in the body), and keeping each refusal's reason (``why``) for its 400."""
    import h11

    class Framed(h11.Connection):
        why: str | None = None

        def next_event(self) -> Any:
            try:
                event = super().next_event()
            except h11.RemoteProtocolError as err:
                self.why = str(err)
                raise
            if isinstance(event, h11.Request):
                names = {name.lower() for name, _ in event.headers}
                if b"content-length" in names and b"transfer-encoding" in names:
                    self.why = "Content-Length together with Transfer-Encoding"
                    raise h11.RemoteProtocolError(self.why, error_status_hint=400)
            return event

    return Framed


def serve_in_thread(app: Any, host: str, port: int, backlog: int = 2048,
                    verbose: bool = False, start_timeout_s: float = 30.0,
                    max_connections: int | None = None, header_timeout_s: float = 10.0):
    """Start uvicorn on a daemon thread; returns (server, thread, bound port). Stop it with
    ``server.should_exit = True`` and ``thread.join()``."""
    sock = bind_socket(host, port, backlog)
    bound = sock.getsockname()[1]
    uv = make_server(app, verbose, max_connections, header_timeout_s)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, name="uvicorn",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            uv.should_exit = True
            sock.close()
            raise ConfigError(f"the HTTP server on {host}:{bound}", "did not start",
                              "run with --verbose to see uvicorn's log")
        time.sleep(0.01)
    return uv, thread, bound
