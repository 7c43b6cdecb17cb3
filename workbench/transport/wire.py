"""The wire format: a 4-byte big-endian length, then one JSON object (UTF-8). Never pickle: a
frame can only ever decode to plain data, whoever wrote it."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

MAX_FRAME = 16 << 20  # a page decision is a few hundred bytes; anything near this is garbage
_LEN = struct.Struct(">I")


class FrameError(ValueError):
    """A frame that is too long or not a JSON object."""


def encode(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return _LEN.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(body.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FrameError(f"not a JSON frame: {err}") from err
    if not isinstance(msg, dict):
        raise FrameError("a frame must hold a JSON object")
    return msg


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendall(encode(msg))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection mid-frame" if buf else "EOF")
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket) -> dict[str, Any]:
    """One frame (blocking, under the socket's timeout). Raises ConnectionError on EOF."""
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > MAX_FRAME:
        raise FrameError(f"frame of {n} bytes exceeds {MAX_FRAME}")
    return decode(_recv_exact(sock, n))


class FrameReader:
    """Accumulates bytes from a non-blocking socket and yields whole frames."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self.buf += data
        out = []
        while len(self.buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self.buf)
            if n > MAX_FRAME:
                raise FrameError(f"frame of {n} bytes exceeds {MAX_FRAME}")
            if len(self.buf) < _LEN.size + n:
                break
            out.append(decode(bytes(self.buf[_LEN.size:_LEN.size + n])))
            del self.buf[:_LEN.size + n]
        return out
