"""A stand-in for vLLM's OpenAI server, for the kind's process plumbing on any CPU: the same
command-line flags, ``/health`` and a streaming ``/v1/completions`` that answers each prompt with
``token = (last prompt token + i) % 1000``, one chunk every ``FAKE_TOKEN_S`` seconds. Like vLLM, it
runs its pool in a child process ("engine core"): with ``WORKBENCH_KV_IPC_NAME`` set, that child
publishes a real control segment and writes a folder under ``WORKBENCH_KV_SOCKET_DIR``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_S = float(os.environ.get("FAKE_TOKEN_S", "0.01"))


def core() -> None:
    """The child: a pool with a control segment, alive until killed."""
    from workbench.config import PoolConfig
    from workbench.core.geometry import KVGeometry
    from workbench.core.ledger import KVCacheManager
    from workbench.sim.device import SimDevice

    name = os.environ["WORKBENCH_KV_IPC_NAME"]
    sock = os.path.join(os.environ["WORKBENCH_KV_SOCKET_DIR"], f"vllm-engine-{os.getppid()}")
    os.makedirs(sock, exist_ok=True)
    kv = KVCacheManager(KVGeometry(num_layers=2, kv_heads=4, head_dim=128, block_size=16,
                                   num_blocks=300), SimDevice(), name=name,
                        config=PoolConfig(ipc_name=name))
    ids = kv.alloc(40)
    print("core ready", len(ids or []), flush=True)
    while True:
        kv.poll_control() if hasattr(kv, "poll_control") else None
        time.sleep(0.05)


class Server(ThreadingHTTPServer):
    # the lab opens 32 streams at once: socketserver's backlog of 5 overflows on a busy machine
    # and a connect is then reset, a request lost that the engine never saw
    request_queue_size = 128


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a) -> None:
        pass

    def do_GET(self) -> None:
        code = 200 if self.path == "/health" and self.server.ready else 503
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        last = req["prompt"][-1] if req["prompt"] else 0
        for i in range(req["max_tokens"]):
            time.sleep(TOKEN_S)
            msg = {"choices": [{"index": 0, "text": "x", "token_ids": [(last + i) % 1000]}]}
            self._chunk(f"data: {json.dumps(msg)}\n\n")
        self._chunk("data: [DONE]\n\n")
        self._chunk("")

    def _chunk(self, s: str) -> None:
        b = s.encode()
        self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
        self.wfile.flush()


def main() -> None:
    if sys.argv[1:2] == ["core"]:
        return core()
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int)
    args, _ = ap.parse_known_args()
    child = None
    if os.environ.get("WORKBENCH_KV_IPC_NAME"):
        child = subprocess.Popen([sys.executable, __file__, "core"])
    srv = Server(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    srv.ready = False
    time.sleep(0.3)
    srv.ready = child is None or child.poll() is None
    srv.serve_forever()


if __name__ == "__main__":
    main()
