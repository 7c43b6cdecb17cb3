"""A worker OS process: one TP rank / PP stage listening on its Unix socket.

Run as ``python -m workbench.transport.server '<json config>'`` (WorkerGroup does this). It owns a
:class:`~workbench.core.worker.WorkerState` on its own device, chosen by
:func:`workbench.backends.make_device` — a SimDevice (``backend="sim"``), host memory (``"host"``:
memfd pages in an mmap range) or the CUDA device (``"gpu"``) — and serves frames from a single
thread, so the state machine never runs concurrently with itself. It exits (and removes its
socket) on ``exit``, on SIGTERM/SIGINT, or when its parent process goes away.

One bad peer never stops it serving the others: every connection is non-blocking with its own
frame buffer and its own reply buffer, a frame begun must be complete within
:data:`FRAME_TIMEOUT` and a reply begun must be taken within :data:`SEND_TIMEOUT` (a peer that
never reads stops being read, and is dropped; nobody else waits for it), else the connection is
dropped. The coordinator (the peer whose pid, from ``SO_PEERCRED``, is the worker's parent) is
always let in; other peers share :data:`MAX_CONNS` places and are dropped after
:data:`IDLE_TIMEOUT` without a frame, so idle peers cannot keep the coordinator out. A frame
that cannot be decoded (too long, nested too deep, not a JSON object, a key named twice) drops
its connection (the peer's framing can no longer be trusted); a well-framed JSON object that is
not a request of a known op is answered with a typed ``bad_request`` error frame and the
connection stays open.

``inject`` (test hook; the socket is private to the user, in a 0700 directory) arms faults in
this process: a device call that fails (``device: {op: k}`` → the k-th next call), a reply that
is never sent and its connection dropped (``drop_reply: op``), a reply held back ``seconds``
(``stall``), or the process dying right after it applied a message (``die_after: op``). An
``inject`` that is not exactly that (unknown field, unknown op or call, k or seconds out of
range) is refused with ``bad_request`` and arms nothing.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import backends, strictjson
from workbench.core.device import FaultyDevice
from workbench.core.geometry import KVGeometry
from workbench.core.messages import (
    SERVER_REQUESTS,
    ErrorType,
    InjectRequest,
    Reply,
    decode_request,
    echo_of,
)
from workbench.core.worker import WorkerState
from workbench.errors import ConfigError, FrameError, ProtocolError, WorkbenchError
from workbench.transport import wire

FRAME_TIMEOUT = 5.0  # seconds from a frame's first byte to its last; a stalled peer is dropped
SEND_TIMEOUT = 5.0  # a peer that does not take a reply within this is dropped
MAX_OUT = 4 << 20  # reply bytes a peer may leave unread before it is dropped
IDLE_TIMEOUT = 10.0  # a peer other than the coordinator with no frame for this long is dropped
MAX_CONNS = 64  # places for peers other than the coordinator; more are closed at once
BACKLOG = 128
TICK = 0.5  # how often the parent and overdue frames are checked while idle


@dataclass(slots=True)
class Conn:
    """One peer: its socket, its partial frame, and when that frame must be complete."""

    sock: socket.socket
    coordinator: bool = False
    reader: wire.FrameReader = field(default_factory=wire.FrameReader)
    deadline: float | None = None  # the frame begun must be complete by then
    out: bytearray = field(default_factory=bytearray)  # replies not yet taken by the peer
    send_deadline: float | None = None  # the reply begun must be taken by then
    active: float = field(default_factory=time.monotonic)  # last frame byte or reply taken

    def due(self) -> float:
        """When this connection must next be looked at (inf: never on its own)."""
        idle = self.active + IDLE_TIMEOUT if not self.coordinator else float("inf")
        return min(self.deadline or idle, self.send_deadline or idle, idle)


class Server:
    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.path = Path(cfg["path"])
        self.parent = int(cfg["parent"])
        geo = dict(cfg["geometry"])
        # the one device chooser; a name it cannot honour is its one-line BackendUnavailable,
        # which WorkerGroup reports from the log; a real device drops the sim-only knobs
        backend = cfg.get("backend", "sim")
        self.device = FaultyDevice(backends.make_device(
            backend, preset=cfg.get("preset", "h200"), capacity=cfg.get("capacity"),
            name=f"{backend}-{cfg['name']}"))
        self.state = WorkerState(KVGeometry(**geo), self.device, name=cfg["name"])
        self.drop_reply: set[str] = set()
        self.stall: dict[str, float] = {}
        self.die_after: set[str] = set()
        self.running = True
        self.conns: dict[socket.socket, Conn] = {}
        old = os.umask(0o077)
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            _remove_stale_socket(self.path)
            self.sock.bind(str(self.path))
            self.bound = os.lstat(self.path)  # shutdown removes this socket, nothing else
        finally:
            os.umask(old)
        self.sock.listen(BACKLOG)
        self.sock.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, None)

    def serve(self) -> None:
        try:
            while self.running:
                if os.getppid() != self.parent:
                    break  # the coordinator died: our tensors have no owner
                for key, events in self.sel.select(timeout=self._wait()):
                    if key.data is None:
                        self._accept()
                    elif key.data.sock in self.conns:
                        self._ready(key.data, events)
                    if not self.running:
                        break
                self._expire()
        finally:
            self.shutdown()

    def _wait(self) -> float:
        now = time.monotonic()
        return max(0.0, min([TICK, *(c.due() - now for c in self.conns.values())]))

    def _expire(self) -> None:
        """Drop every peer whose frame or reply is overdue, and idle strangers: half a frame
        then silence, a reply never read, or a connection held open wedge nobody."""
        now = time.monotonic()
        for c in [c for c in self.conns.values() if c.due() <= now]:
            self._drop(c)

    def _accept(self) -> None:
        """Drain the backlog: a flood of connects must not leave the coordinator's refused."""
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:  # backlog empty, or the peer gave up before we got to it
                return
            coordinator = _peer_pid(sock) == self.parent
            strangers = sum(not c.coordinator for c in self.conns.values())
            if not coordinator and strangers >= MAX_CONNS:
                sock.close()
                continue
            sock.setblocking(False)
            c = Conn(sock, coordinator)
            self.conns[sock] = c
            self.sel.register(sock, selectors.EVENT_READ, c)

    def _drop(self, c: Conn) -> None:
        if self.conns.pop(c.sock, None) is not None:
            self.sel.unregister(c.sock)
        c.sock.close()

    def _ready(self, c: Conn, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(c)
        elif events & selectors.EVENT_READ:
            self._readable(c)

    def _readable(self, c: Conn) -> None:
        c.active = time.monotonic()
        try:
            data = c.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(c)
            return
        try:
            frames = c.reader.feed(data)
        except FrameError:
            self._drop(c)
            return
        if not c.reader.partial:
            c.deadline = None
        elif frames or c.deadline is None:  # a new frame began: its own deadline
            c.deadline = time.monotonic() + FRAME_TIMEOUT
        for msg in frames:
            if not self._answer(c, msg):
                return

    def _answer(self, c: Conn, msg: dict[str, Any]) -> bool:
        """Apply one message and send its reply; False when the connection is gone."""
        try:
            req = decode_request(msg, SERVER_REQUESTS)
        except ProtocolError as err:
            op, seq = echo_of(msg)
            reply = Reply.error(ErrorType.BAD_REQUEST, str(err), op=op, seq=seq,
                                worker=self.state.name)
            return self._send(c, reply.to_json())
        op = req.op
        if isinstance(req, InjectRequest):
            reply = self._inject(req)
        elif op == "exit":
            self.running = False
            reply = Reply.ok(op=op, seq=req.seq)
        else:
            reply = self.state.apply(req)
        if op in self.die_after:
            os._exit(17)  # a crash right after applying, before any reply
        if op in self.drop_reply:
            self.drop_reply.discard(op)
            self._drop(c)  # the caller sees the connection end: outcome unknown to it
            return False
        if op in self.stall:
            time.sleep(self.stall.pop(op))
        return self._send(c, reply.to_json())

    def _send(self, c: Conn, obj: dict[str, Any]) -> bool:
        """Queue a reply and send what the peer takes now; never waits for it."""
        try:
            c.out += wire.encode(obj)
        except FrameError:
            self._drop(c)
            return False
        if len(c.out) > MAX_OUT:  # it reads nothing: keep no more for it
            self._drop(c)
            return False
        return self._flush(c)

    def _flush(self, c: Conn) -> bool:
        try:
            sent = c.sock.send(c.out) if c.out else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(c)
            return False
        del c.out[:sent]
        if sent:
            c.active = time.monotonic()
        if not c.out:  # all taken: read from it again
            if c.send_deadline is not None:
                c.send_deadline = None
                self.sel.modify(c.sock, selectors.EVENT_READ, c)
        elif c.send_deadline is None:  # stop reading it until it takes its replies
            c.send_deadline = time.monotonic() + SEND_TIMEOUT
            self.sel.modify(c.sock, selectors.EVENT_WRITE, c)
        elif sent:
            c.send_deadline = time.monotonic() + SEND_TIMEOUT  # progress: its own deadline
        return c.sock in self.conns

    def _inject(self, req: InjectRequest) -> Reply:
        for call, k in req.device.items():
            self.device.fail_next(call, k)
        if req.drop_reply:
            self.drop_reply.add(req.drop_reply)
        if req.stall:
            self.stall[req.stall] = req.seconds
        if req.die_after:
            self.die_after.add(req.die_after)
        return Reply.ok(op=req.op, seq=req.seq, worker=self.state.name)

    def shutdown(self) -> None:
        for c in list(self.conns.values()):
            self._drop(c)
        self.sel.close()
        self.sock.close()
        try:
            now = os.lstat(self.path)
            if (now.st_dev, now.st_ino) == (self.bound.st_dev, self.bound.st_ino):
                self.path.unlink()
        except (FileNotFoundError, AttributeError):
            pass
        if not self.state.closed:
            self.state.close()
        close = getattr(self.device.inner, "close", None)
        if callable(close):  # a CUDA device gives its context's memory back explicitly
            try:
                close()
            except Exception:  # noqa: BLE001 - exiting anyway; the driver frees the rest
                pass


def _remove_stale_socket(path: Path) -> None:
    """A dead worker's socket under our name is removed; anything else there (a file, a
    directory, a link) is not ours to remove: OSError, reported by ``main`` in one line."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        raise FileExistsError(errno.EEXIST, "something that is not this user's socket is there")
    path.unlink()


def _peer_pid(sock: socket.socket) -> int:
    """The connecting process's pid (Linux ``SO_PEERCRED``), or -1 where it cannot be known."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[0]
    except (OSError, AttributeError):
        return -1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        cfg = _config(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    if cfg.get("cuda_visible_devices") is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(cfg["cuda_visible_devices"])

    def stop(signum, frame):  # noqa: ARG001
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server = Server(cfg)
    except WorkbenchError as err:  # e.g. a backend this host cannot honour: one line, no trace
        print(f"{type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return 1
    except OSError as err:  # the socket's folder is missing or not ours to write
        print(f"error: worker socket {cfg['path']}: cannot listen there ({err.strerror}). Fix: "
              "pass a path in an existing folder this user may write", file=sys.stderr,
              flush=True)
        return 2
    except (TypeError, ValueError, KeyError) as err:  # a geometry field the device refuses
        print(f"error: worker config: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return 2
    print("ready", flush=True)
    server.serve()
    return 0


CONFIG_FIELDS = {"geometry": dict, "path": str, "parent": int, "name": str}


def _config(args: list[str]) -> dict[str, Any]:
    """The worker's one argument: a JSON object with at least ``CONFIG_FIELDS``, or one line."""
    if len(args) != 1:
        raise ConfigError("worker arguments", f"{len(args)} given, expected one JSON config",
                          "run it as `python -m workbench.transport.server '<json>'`")
    try:
        cfg = strictjson.loads(args[0])
    except (ValueError, RecursionError) as err:
        raise ConfigError("worker config", f"not JSON ({err})", "pass one JSON object") from None
    if not isinstance(cfg, dict):
        raise ConfigError("worker config", f"a JSON {type(cfg).__name__}, not an object",
                          "pass one JSON object")
    for key, kind in CONFIG_FIELDS.items():
        v = cfg.get(key)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise ConfigError(f"worker config {key}", f"{v!r:.40} is not a {kind.__name__}",
                              f"give {', '.join(CONFIG_FIELDS)}")
    return cfg


if __name__ == "__main__":
    sys.exit(main())
