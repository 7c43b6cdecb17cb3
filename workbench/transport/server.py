"""A worker OS process: one TP rank / PP stage listening on its Unix socket.

Run as ``python -m workbench.transport.server '<json config>'`` (WorkerGroup does this). It owns a
:class:`~workbench.core.worker.WorkerState` on its own device — a SimDevice (``backend="sim"``),
host memory (``"host"``: memfd pages in an mmap range) or the CUDA device
(``workbench.gpu.make_device``, ``"gpu"``) — and serves frames serially
from a single thread, so the state machine never runs concurrently with itself. It exits (and
removes its socket) on ``exit``, on SIGTERM/SIGINT, or when its parent process goes away.

``inject`` (test hook; the socket is private to the user) arms faults in this process: a device
call that fails (``device: {op: k}`` → the k-th next call), a reply that is never sent and its
connection dropped (``drop_reply: op``), a reply held back ``seconds`` (``stall``), or the
process dying right after it applied a message (``die_after: op``).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from workbench.core.device import FaultyDevice
from workbench.core.geometry import KVGeometry
from workbench.core.worker import WorkerState
from workbench.transport import wire


def make_device(cfg: dict[str, Any]):
    if cfg.get("backend", "sim") == "gpu":
        from workbench.gpu import make_device as gpu_device  # lazy: CPU hosts never import CUDA

        return gpu_device()
    if cfg.get("backend") == "host":  # real memory: memfd pages mapped into an mmap range
        from workbench.host.device import HostDevice

        return HostDevice(capacity=cfg.get("capacity"), name=f"host-{cfg['name']}")
    from workbench.sim.device import SimDevice

    return SimDevice(cfg.get("preset", "h200"), capacity=cfg.get("capacity"),
                     name=f"sim-{cfg['name']}")


class Server:
    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.path = Path(cfg["path"])
        self.parent = int(cfg["parent"])
        geo = dict(cfg["geometry"])
        self.device = FaultyDevice(make_device(cfg))
        self.state = WorkerState(KVGeometry(**geo), self.device, name=cfg["name"])
        self.drop_reply: set[str] = set()
        self.stall: dict[str, float] = {}
        self.die_after: set[str] = set()
        self.running = True
        old = os.umask(0o077)
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if self.path.exists():
                self.path.unlink()  # a stale socket of a dead worker with our name
            self.sock.bind(str(self.path))
        finally:
            os.umask(old)
        self.sock.listen(16)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, None)

    def serve(self) -> None:
        try:
            while self.running:
                if os.getppid() != self.parent:
                    break  # the coordinator died: our tensors have no owner
                for key, _ in self.sel.select(timeout=0.5):
                    if key.data is None:
                        conn, _ = self.sock.accept()
                        conn.setblocking(True)
                        conn.settimeout(10.0)
                        self.sel.register(conn, selectors.EVENT_READ, "conn")
                    else:
                        self._serve_one(key.fileobj)
        finally:
            self.shutdown()

    def _drop(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        conn.close()

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            msg = wire.recv(conn)
        except (OSError, ConnectionError, wire.FrameError):
            self._drop(conn)
            return
        op = msg.get("op")
        if op == "inject":
            reply = self._inject(msg)
        elif op == "exit":
            self.running = False
            reply = {"status": "ok", "op": "exit", "seq": msg.get("seq")}
        else:
            reply = self.state.handle(msg)
        if op in self.die_after:
            os._exit(17)  # a crash right after applying, before any reply
        if op in self.drop_reply:
            self.drop_reply.discard(op)
            self._drop(conn)  # the caller sees the connection end: outcome unknown to it
            return
        if op in self.stall:
            time.sleep(self.stall.pop(op))
        try:
            wire.send(conn, reply)
        except OSError:
            self._drop(conn)

    def _inject(self, msg: dict[str, Any]) -> dict[str, Any]:
        for op, k in (msg.get("device") or {}).items():
            self.device.fail_next(op, int(k))
        if msg.get("drop_reply"):
            self.drop_reply.add(msg["drop_reply"])
        if msg.get("stall"):
            self.stall[msg["stall"]] = float(msg.get("seconds", 5.0))
        if msg.get("die_after"):
            self.die_after.add(msg["die_after"])
        return {"status": "ok", "op": "inject", "seq": msg.get("seq")}

    def shutdown(self) -> None:
        for key in list(self.sel.get_map().values()):
            if key.data == "conn":
                key.fileobj.close()
        self.sel.close()
        self.sock.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        if not self.state.closed:
            self.state.close()
        close = getattr(self.device.inner, "close", None)
        if callable(close):  # a CUDA device gives its context's memory back explicitly
            try:
                close()
            except Exception:  # noqa: BLE001 - exiting anyway; the driver frees the rest
                pass


def main(argv: list[str] | None = None) -> int:
    cfg = json.loads((argv or sys.argv[1:])[0])
    if cfg.get("cuda_visible_devices") is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(cfg["cuda_visible_devices"])

    def stop(signum, frame):  # noqa: ARG001
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server = Server(cfg)
    print("ready", flush=True)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
