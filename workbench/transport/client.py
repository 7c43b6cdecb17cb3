"""The coordinator's side of the real transport: worker processes and the sockets to them.

:class:`SocketTransport` sends one frame per target at once over persistent connections and
waits for every reply until one deadline (the timeout of the exchange). A target whose socket
file is missing fails :meth:`~SocketTransport.check` before anything is sent; a refused
connect is a message known not to be delivered; a connection that ends or a deadline that passes
after the frame went out is an unknown outcome (``None``).

:class:`WorkerGroup` starts TP x PP worker processes for one pool in a private socket directory
and removes processes, sockets and directory on :meth:`~WorkerGroup.shutdown`.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import selectors
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# by its full name: ``from workbench.transport import wire`` names the package, whose __init__
# imports this module (an import circle)
import workbench.transport.wire as wire
from workbench import owned
from workbench.core.coordinator import (
    Answer,
    FanOutSpace,
    TransportError,
    WorkerId,
    targets_for,
)
from workbench.core.geometry import KVGeometry
from workbench.core.messages import (
    SERVER_REQUESTS,
    ExitRequest,
    Reply,
    Request,
    StateRequest,
    Status,
    decode_request,
    reply_or_raw,
)
from workbench.transport.paths import make_pool_dir, remove_pool_dir, socket_path


class SocketTransport:
    """Length-prefixed JSON over Unix sockets, a timeout on every exchange."""

    def __init__(self, paths: Mapping[WorkerId, Path], connect_timeout: float = 10.0):
        self.paths = dict(paths)
        self.connect_timeout = connect_timeout
        self.conns: dict[WorkerId, socket.socket] = {}

    def now(self) -> float:
        return time.monotonic()

    def check(self, targets: Iterable[WorkerId]) -> None:
        missing = []
        for t in targets:
            p = self.paths.get(t)
            try:
                ok = p is not None and stat.S_ISSOCK(os.stat(p).st_mode)
            except OSError:
                ok = False
            if not ok:
                missing.append(f"{t} ({p})")
        if missing:
            raise TransportError(f"no listener for {', '.join(missing)}: start every stage's "
                                 "workers before the pool uses them (nothing was sent)")

    def _conn(self, t: WorkerId) -> socket.socket:
        s = self.conns.get(t)
        if s is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.connect_timeout)
            give_up = time.monotonic() + self.connect_timeout
            while True:
                try:
                    s.connect(str(self.paths[t]))
                    break
                except BlockingIOError:  # the listener's backlog is full: it is busy, not gone
                    if time.monotonic() < give_up:
                        time.sleep(0.005)
                        continue
                    s.close()
                    raise
                except OSError:
                    s.close()
                    raise
            self.conns[t] = s
        return s

    def _close(self, t: WorkerId) -> None:
        s = self.conns.pop(t, None)
        if s is not None:
            s.close()

    def exchange(self, requests: Mapping[WorkerId, Request],
                 timeout: float) -> dict[WorkerId, Answer]:
        deadline = time.monotonic() + timeout
        replies: dict[WorkerId, Answer] = {t: None for t in requests}
        sel = selectors.DefaultSelector()
        readers: dict[WorkerId, wire.FrameReader] = {}
        try:
            for t, msg in requests.items():
                try:
                    s = self._conn(t)
                except OSError as err:  # never connected: certainly not delivered
                    replies[t] = Reply(status=Status.UNDELIVERED, op=msg.op, seq=msg.seq,
                                       message=f"connect to {self.paths[t]} failed: {err}")
                    continue
                try:
                    s.settimeout(max(0.001, deadline - time.monotonic()))
                    wire.send(s, msg.to_json())
                except OSError:
                    self._close(t)  # part of a frame may have gone out: unknown
                    continue
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, t)
                readers[t] = wire.FrameReader()
            while readers:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in sel.select(timeout=left):
                    t = key.data
                    try:
                        data = key.fileobj.recv(65536)
                        frames = readers[t].feed(data) if data else None
                    except (OSError, wire.FrameError):
                        frames = None
                    if frames is None:  # connection ended before a reply: unknown
                        sel.unregister(key.fileobj)
                        del readers[t]
                        self._close(t)
                        continue
                    for f in frames:
                        if f.get("seq") == requests[t].seq:
                            replies[t] = reply_or_raw(f)
                    if replies[t] is not None:
                        sel.unregister(key.fileobj)
                        key.fileobj.setblocking(True)
                        del readers[t]
            for t in list(readers):  # timed out: drop the connection, a late reply dies with it
                sel.unregister(self.conns[t])
                self._close(t)
        finally:
            sel.close()
        return replies

    def close(self) -> None:
        for t in list(self.conns):
            self._close(t)


class WorkerGroup:
    """TP x PP worker processes for one pool (see module doc). A context manager."""

    def __init__(self, geometry: KVGeometry, tp: int = 1, pp: int = 1, *, name: str = "pool",
                 backend: str = "sim", capacity: int | None = None, start_timeout: float = 60.0,
                 missing: Iterable[WorkerId] = (), gpus: list[int] | None = None):
        self.geometry, self.tp, self.pp, self.name = geometry, tp, pp, name
        self.dir = make_pool_dir(name)
        self.paths = {t: socket_path(self.dir, t) for t in targets_for(tp, pp)}
        self.procs: dict[WorkerId, subprocess.Popen] = {}
        self.closed = False
        atexit.register(self.shutdown)  # a normal exit cleans up too (SIGKILL needs gc_sockets)
        self._owned = owned.own(f"workers of {self.dir}", self._undo)  # and a signal
        geo = {f.name: getattr(geometry, f.name) for f in dataclasses.fields(geometry)}
        geo["layout"] = geometry.layout.value
        skip = set(missing)
        try:
            for i, t in enumerate(self.paths):
                if t in skip:
                    continue  # a stage whose listener never starts (tests the preflight)
                cfg = {"geometry": geo, "path": str(self.paths[t]), "name": str(t),
                       "parent": os.getpid(), "backend": backend, "capacity": capacity,
                       "cuda_visible_devices": None if gpus is None else gpus[i % len(gpus)]}
                log = open(self.dir / f"{t.pp}-{t.tp}.log", "wb")  # noqa: SIM115
                self.procs[t] = subprocess.Popen(
                    [sys.executable, "-m", "workbench.transport.server", json.dumps(cfg)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                    close_fds=True)
                log.close()
            self._wait_ready(start_timeout)
        except BaseException:
            self.shutdown()
            raise
        self.transport = SocketTransport(self.paths)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t, proc in self.procs.items():
            while True:
                if proc.poll() is not None:
                    raise TransportError(f"worker {t} exited ({proc.returncode}) while starting:"
                                         f" {self.log_tail(t)}")
                try:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                        s.settimeout(2.0)
                        s.connect(str(self.paths[t]))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TransportError(f"worker {t} did not listen within {timeout:g}s: "
                                             f"{self.log_tail(t)}") from None
                    time.sleep(0.02)

    def log_tail(self, t: WorkerId) -> str:
        try:
            return (self.dir / f"{t.pp}-{t.tp}.log").read_text(errors="replace")[-800:]
        except OSError:
            return "(no log)"

    def space(self, pp_rank: int = -1, **kw: Any) -> FanOutSpace:
        """A FanOutSpace over every TP rank of stage ``pp_rank`` (every stage when -1)."""
        return FanOutSpace(self.geometry, self.transport, targets_for(self.tp, self.pp, pp_rank),
                           **kw)

    def send(self, t: WorkerId, msg: Request | Mapping[str, Any],
             timeout: float = 30.0) -> dict[str, Any] | None:
        """One message to one worker (tests, inspection): its reply as a JSON object, or None.
        A dict is checked as a request first (ProtocolError if it is not one)."""
        req = msg if isinstance(msg, Request) else decode_request(dict(msg), SERVER_REQUESTS)
        req.seq = -int(time.monotonic_ns() % (1 << 40))
        r = self.transport.exchange({t: req}, timeout)[t]
        return r.to_json() if isinstance(r, Reply) else r

    def inject(self, t: WorkerId, **faults: Any) -> None:
        r = self.send(t, {"op": "inject", **faults})
        if not r or r.get("status") != "ok":
            raise TransportError(f"inject on {t} failed: {r}")

    def states(self, timeout: float = 30.0) -> dict[WorkerId, dict[str, Any] | None]:
        return {t: self.send(t, StateRequest(), timeout) for t in self.procs}

    def kill(self, t: WorkerId, sig: int) -> None:
        self.procs[t].send_signal(sig)
        self.procs[t].wait(timeout=30)

    def shutdown(self, timeout: float = 20.0) -> None:
        """Stop every worker (exit, then SIGTERM, then SIGKILL) and remove the socket dir."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.shutdown)
        owned.disown(self._owned)
        transport = getattr(self, "transport", None)
        for t, proc in self.procs.items():
            if proc.poll() is None and transport is not None:
                try:
                    transport.exchange({t: ExitRequest(seq=0)}, 5.0)
                except Exception:  # noqa: BLE001 - shutdown goes on regardless
                    pass
        if transport is not None:
            transport.close()
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            for sig in (None, "term", "kill"):
                if sig == "term":
                    proc.terminate()
                elif sig == "kill":
                    proc.kill()
                try:
                    proc.wait(timeout=max(0.5, deadline - time.monotonic()) if sig is None
                              else 5.0)
                    break
                except subprocess.TimeoutExpired:
                    continue
        remove_pool_dir(self.dir)

    def _undo(self) -> None:
        """The quick way out, for a signal: no exit messages, just TERM, a moment, KILL."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 2.0
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        remove_pool_dir(self.dir)

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
