"""A stand-in for SGLang's server, for the ``sglang`` kind's plumbing on any CPU: its flags,
``/health``, ``/flush_cache`` and a streamed ``/generate`` taking ``input_ids`` that answers with
``token = (last prompt token + i) % 1000``, ``output_ids`` growing whole in every chunk as SGLang
streams them by default. With ``WORKBENCH_KV_IPC_NAME`` set, a child publishes a real control
segment (the vllm stand-in's "engine core"), as SGLang's scheduler process would."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN_S = float(os.environ.get("FAKE_TOKEN_S", "0.01"))
CORE = Path(__file__).with_name("fake_server.py")


def _pool_up() -> bool:
    """Healthy once the pool's segment is published (SGLang builds its pool before serving)."""
    name = os.environ.get("WORKBENCH_KV_IPC_NAME")
    if not name:
        return True
    from workbench.core import control

    return control.read_segment(name) is not None


class Server(ThreadingHTTPServer):
    # the lab opens 32 streams at once: socketserver's backlog of 5 overflows on a busy machine
    # and a connect is then reset, a request lost that the engine never saw
    request_queue_size = 128


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" and _pool_up() else
                           503 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/flush_cache":  # SGLang refuses it while requests run
            busy = self.server.live > 0
            text = b"Cache not flushed: requests running" if busy else b"Cache flushed."
            self.send_response(400 if busy else 200)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
            return
        req = json.loads(body)
        assert self.path == "/generate" and req["stream"] is True
        self.server.live += 1
        self.live_left = 1
        try:
            self._generate(req)
        finally:
            self.server.live -= self.live_left
        self._chunk("data: [DONE]\n\n")
        self._chunk("")

    def _generate(self, req: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        ids, last = [], req["input_ids"][-1] if req["input_ids"] else 0
        n = req["sampling_params"]["max_new_tokens"]
        self.live_left = 1
        for i in range(n):
            time.sleep(TOKEN_S)
            ids.append((last + i) % 1000)
            if i == n - 1:  # finished before its last token reaches the client, as in SGLang
                self.server.live -= 1
                self.live_left = 0
            msg = {"output_ids": list(ids), "meta_info": {
                "completion_tokens": len(ids), "cached_tokens": 0,
                "prompt_tokens": len(req["input_ids"])}}
            self._chunk(f"data: {json.dumps(msg)}\n\n")

    def _chunk(self, s: str) -> None:
        b = s.encode()
        self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
        self.wfile.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int)
    ap.add_argument("--skip-tokenizer-init", action="store_true")
    args, _ = ap.parse_known_args()
    assert args.skip_tokenizer_init  # the kind sends token ids, never text
    if os.environ.get("WORKBENCH_KV_IPC_NAME"):
        subprocess.Popen([sys.executable, str(CORE), "core"])
    srv = Server(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    srv.live = 0  # requests streaming now
    srv.serve_forever()


if __name__ == "__main__":
    main()
