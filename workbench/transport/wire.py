"""The wire format: a 4-byte big-endian length, then one JSON object (UTF-8). Never pickle: a
frame can only ever decode to plain data, whoever wrote it.

Every bound is checked before the body is parsed: the length against :data:`MAX_FRAME` (from the
header alone, before the body is read) and the nesting depth against :data:`MAX_DEPTH` (by a scan
that never recurses), so a hostile frame costs one linear pass and cannot exhaust the stack."""

from __future__ import annotations

import json
import re
import socket
import struct
from itertools import accumulate
from typing import Any

from workbench import strictjson
from workbench.errors import FrameError, PeerClosedError
from workbench.units import MiB

__all__ = ["MAX_DEPTH", "MAX_FRAME", "FrameError", "FrameReader", "decode", "encode", "recv",
           "send"]

MAX_FRAME = MiB  # a page decision is a few hundred bytes; a state reply of 100k pages fits
MAX_DEPTH = 32  # a protocol message nests 3 deep
_LEN = struct.Struct(">I")
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # both patterns match in linear time: no backtracking
_STRING = re.compile(rb'"[^"]*"')
_OTHER = bytes(c for c in range(256) if c not in b"[{]}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def _too_long(n: int) -> FrameError:
    return FrameError(f"frame of {n} bytes", f"the limit is {MAX_FRAME} bytes",
                      "send one protocol message per frame")


def encode(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise _too_long(len(body))
    return _LEN.pack(len(body)) + body


def nesting_depth(body: bytes) -> int:
    """The deepest ``[``/``{`` nesting of a JSON text, found in linear time without parsing or
    recursion: escapes are dropped, then strings (brackets inside them do not count), then
    everything but brackets. Up to the first syntax error this agrees with the parser."""
    shape = _STRING.sub(b"", _ESCAPE.sub(b"", body)).translate(None, _OTHER)
    return max(accumulate(map(_STEP.__getitem__, shape)), default=0)


def decode(body: bytes) -> dict[str, Any]:
    """One frame's body as a JSON object; FrameError for anything else (checked bounds first)."""
    if len(body) > MAX_FRAME:
        raise _too_long(len(body))
    depth = nesting_depth(body)
    if depth > MAX_DEPTH:
        raise FrameError(f"frame nested {depth} deep", f"the limit is {MAX_DEPTH}",
                         "send a protocol message (it nests 3 deep)")
    try:
        # a key named twice drops the frame (not guessed); NaN is left to the message schema
        msg = strictjson.loads(body.decode(), constants=True)
    except (ValueError, RecursionError) as err:  # also an int literal past Python's digit limit
        raise FrameError("frame body", f"not UTF-8 JSON ({err})",
                         "send one JSON object per frame (never pickle)") from err
    if not isinstance(msg, dict):
        raise FrameError("frame body", f"a JSON {type(msg).__name__}, not an object",
                         "send one JSON object per frame")
    return msg


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendall(encode(msg))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            where = "mid-frame" if buf else "at a frame boundary"
            raise PeerClosedError(f"the peer closed the connection {where}: nothing more can "
                                  "be read; reconnect to send again")
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket) -> dict[str, Any]:
    """One frame (blocking, under the socket's timeout). Raises PeerClosedError (a
    ConnectionError) on EOF."""
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > MAX_FRAME:
        raise _too_long(n)
    return decode(_recv_exact(sock, n))


class FrameReader:
    """Accumulates bytes from a non-blocking socket and yields whole frames. A header that
    announces more than :data:`MAX_FRAME` fails at once, before its body is buffered."""

    def __init__(self) -> None:
        self.buf = bytearray()

    @property
    def partial(self) -> bool:
        """True while part of a frame is buffered (its sender owes the rest)."""
        return bool(self.buf)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self.buf += data
        out = []
        while len(self.buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self.buf)
            if n > MAX_FRAME:
                raise _too_long(n)
            if len(self.buf) < _LEN.size + n:
                break
            body = bytes(self.buf[_LEN.size:_LEN.size + n])
            del self.buf[:_LEN.size + n]
            out.append(decode(body))
        return out
