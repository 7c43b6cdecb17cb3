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


def make_server(app: Any, verbose: bool = False, max_connections: int | None = None) -> Any:
    """uvicorn has no timeout for a request's headers or body (only keep-alive between
    requests): apps time their own body reads, and ``max_connections`` caps what idle or slow
    clients can hold (past it uvicorn answers 503)."""
    import uvicorn

    cfg = uvicorn.Config(app, http="h11", lifespan="off", log_level="info" if verbose
                         else "warning", access_log=verbose, timeout_keep_alive=5,
                         timeout_graceful_shutdown=3, limit_concurrency=max_connections)
    return uvicorn.Server(cfg)


def serve_in_thread(app: Any, host: str, port: int, backlog: int = 2048,
                    verbose: bool = False, start_timeout_s: float = 30.0,
                    max_connections: int | None = None):
    """Start uvicorn on a daemon thread; returns (server, thread, bound port). Stop it with
    ``server.should_exit = True`` and ``thread.join()``."""
    sock = bind_socket(host, port, backlog)
    bound = sock.getsockname()[1]
    uv = make_server(app, verbose, max_connections)
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
