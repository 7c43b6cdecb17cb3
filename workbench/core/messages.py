"""The TP/PP protocol's messages: typed requests and replies with a validated JSON round trip.

The coordinator (:mod:`workbench.core.coordinator`) sends one :class:`Request` per target; the
worker (:mod:`workbench.core.worker`) answers each with one :class:`Reply`. On every transport
(SimPy or Unix sockets) a message travels as a JSON object: ``to_json()`` writes the wire form,
``decode_request``/``Reply.from_json`` read it back and refuse anything that is not exactly a
message of a known kind (unknown ``op``, a missing, extra or mistyped field) with a
:class:`~workbench.errors.ProtocolError`. Errors travel as replies (``status="error"``) whose
``error_type`` is an :class:`ErrorType`, never as exceptions across a process boundary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, NamedTuple

from workbench.core.device import VMM_OPS
from workbench.errors import ProtocolError


class StrEnum(str, Enum):  # enum.StrEnum is Python >= 3.11; the project supports 3.10
    def __str__(self) -> str:
        return str(self.value)


MAX_STR = 4096  # a txid is 32 hex digits, an error message a few hundred characters
MAX_FAULT_CALLS = 1 << 20  # inject: "fail the k-th next call" with k up to this
MAX_STALL_S = 60.0


class Status(StrEnum):
    OK = "ok"
    ERROR = "error"
    UNDELIVERED = "undelivered"  # a transport's status for a message it knows it never sent


class ErrorType(StrEnum):
    """Why a worker refused or failed a request (see :mod:`workbench.core.worker`)."""

    DEVICE = "device"  # a driver call failed; nothing changed
    MAP_QUARANTINED = "map_quarantined"  # a local rollback failed
    BUSY = "busy"  # an unmap transaction is pending
    ABORTED = "aborted"  # prepare/commit of a transaction already aborted
    NOT_PREPARED = "not_prepared"  # commit of a txid never prepared here (now fenced)
    STATE_CONSISTENCY = "state_consistency"  # the worker's backing is unknown; it refuses work
    BAD_REQUEST = "bad_request"  # a malformed or unknown message
    BAD_FRAME = "bad_frame"  # a frame that cannot be decoded (too long, too deep, not JSON)
    UNREACHABLE = "unreachable"  # (coordinator side) the listener is gone


FATAL = (ErrorType.STATE_CONSISTENCY, ErrorType.UNREACHABLE)


class WorkerId(NamedTuple):
    pp: int
    tp: int

    def __str__(self) -> str:
        return f"pp{self.pp}/w{self.tp}"


def targets_for(tp_size: int, pp_size: int = 1, pp_rank: int = -1) -> list[WorkerId]:
    """Every TP rank of one stage, or of every stage when ``pp_rank`` is -1 (fan-out)."""
    stages = range(pp_size) if pp_rank == -1 else [pp_rank]
    return [WorkerId(pp, tp) for pp in stages for tp in range(tp_size)]


# -- field checks, keyed by the annotation string (``from __future__ import annotations``) -------
# a scalar integer (seq, epoch, a count) fits 64 bits, signed or not: nothing bigger is echoed;
# a list's ids are checked against the pool by the worker, which names the bad one
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return _whole(v) and INT_MIN <= v <= INT_MAX


def _str(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_STR


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(_whole(x) for x in v)


def _float(v: Any) -> bool:
    return (_int(v) or isinstance(v, float)) and math.isfinite(v)


def _calls(v: Any) -> bool:
    return isinstance(v, dict) and all(_str(k) and _int(n) for k, n in v.items())


_STATUSES, _ERROR_TYPES = frozenset(Status), frozenset(ErrorType)  # str-valued: plain str match
_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": _int, "int | None": _opt(_int), "str": _str, "str | None": _opt(_str),
    "bool": lambda v: isinstance(v, bool), "bool | None": _opt(lambda v: isinstance(v, bool)),
    "float": _float, "list[int]": _ints, "list[int] | None": _opt(_ints),
    "dict[str, int]": _calls, "Status": lambda v: isinstance(v, str) and v in _STATUSES,
    "ErrorType | None": lambda v: v is None or (isinstance(v, str) and v in _ERROR_TYPES),
}
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "Status": Status, "ErrorType | None": lambda v: None if v is None else ErrorType(v),
    "float": float, "list[int]": list, "list[int] | None": lambda v: None if v is None else list(v),
    "dict[str, int]": dict,
}


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _fields(cls: type, obj: Mapping[str, Any], what: str, skip: Iterable[str] = ()) -> dict:
    """The constructor arguments of dataclass ``cls`` read from ``obj``, each checked."""
    spec = {f.name: f for f in dataclasses.fields(cls)}
    extra = sorted(set(obj) - set(spec) - set(skip), key=str)
    if extra:
        raise ProtocolError(what, f"unknown field(s) {_short(extra)}",
                            f"send only the fields {', '.join(spec)}")
    kw = {}
    for name, f in spec.items():
        if name not in obj:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(what, f"field {name!r} is missing", f"send {name!r} ({f.type})")
            continue
        v = obj[name]
        if not _CHECKS[str(f.type)](v):
            raise ProtocolError(what, f"field {name!r} is {_short(v)}, not {f.type}",
                                f"send {name!r} as {f.type}")
        kw[name] = _CONVERT.get(str(f.type), lambda x: x)(v)
    return kw


def _wire(msg: Any) -> dict[str, Any]:
    return {f.name: v for f in dataclasses.fields(msg)
            if (v := getattr(msg, f.name)) is not None}


# -- requests ------------------------------------------------------------------------------------
@dataclass(slots=True, kw_only=True)
class Request:
    """Base of every request; ``seq`` is set by the coordinator and echoed by the reply."""

    op: ClassVar[str] = ""
    seq: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, **_wire(self)}

    def check(self) -> None:
        """Checks beyond the field types (ranges, names). Raises ProtocolError."""


@dataclass(slots=True, kw_only=True)
class MapRequest(Request):
    op: ClassVar[str] = "map"
    pages: list[int]


@dataclass(slots=True, kw_only=True)
class UnmapRequest(Request):
    op: ClassVar[str] = "unmap"
    pages: list[int]


@dataclass(slots=True, kw_only=True)
class PrepareRequest(Request):
    op: ClassVar[str] = "prepare"
    txid: str
    pages: list[int]
    commit: bool = False


@dataclass(slots=True, kw_only=True)
class CommitRequest(Request):
    op: ClassVar[str] = "commit"
    txid: str


@dataclass(slots=True, kw_only=True)
class AbortRequest(Request):
    op: ClassVar[str] = "abort"
    txid: str


@dataclass(slots=True, kw_only=True)
class BarrierRequest(Request):
    op: ClassVar[str] = "barrier"
    epoch: int


@dataclass(slots=True, kw_only=True)
class StateRequest(Request):
    op: ClassVar[str] = "state"


@dataclass(slots=True, kw_only=True)
class PingRequest(Request):
    op: ClassVar[str] = "ping"


@dataclass(slots=True, kw_only=True)
class CloseRequest(Request):
    op: ClassVar[str] = "close"


@dataclass(slots=True, kw_only=True)
class ExitRequest(Request):
    """The worker process leaves (served by the process, not the state machine)."""

    op: ClassVar[str] = "exit"


@dataclass(slots=True, kw_only=True)
class InjectRequest(Request):
    """Test hook of a worker process: arm faults (see :mod:`workbench.transport.server`)."""

    op: ClassVar[str] = "inject"
    device: dict[str, int] = field(default_factory=dict)  # device call -> fail the k-th next
    drop_reply: str | None = None
    stall: str | None = None
    seconds: float = 5.0
    die_after: str | None = None

    def check(self) -> None:
        what = "inject"
        for call, k in self.device.items():
            if call not in VMM_OPS:
                raise ProtocolError(what, f"device call {_short(call)} is not one of "
                                    f"{', '.join(VMM_OPS)}", "name a device call")
            if not 1 <= k <= MAX_FAULT_CALLS:
                raise ProtocolError(what, f"device call {call}: k={k} is outside "
                                    f"1..{MAX_FAULT_CALLS}", "fail the k-th next call, k >= 1")
        for name in ("drop_reply", "stall", "die_after"):
            op = getattr(self, name)
            if op is not None and op not in WORKER_REQUESTS:
                raise ProtocolError(what, f"{name}={_short(op)} is not a protocol op",
                                    f"use one of {', '.join(WORKER_REQUESTS)}")
        if not 0.0 <= self.seconds <= MAX_STALL_S:
            raise ProtocolError(what, f"seconds={self.seconds} is outside 0..{MAX_STALL_S:g}",
                                "stall a reply for a bounded time")


WORKER_REQUESTS: dict[str, type[Request]] = {c.op: c for c in (
    MapRequest, UnmapRequest, PrepareRequest, CommitRequest, AbortRequest, BarrierRequest,
    StateRequest, PingRequest, CloseRequest)}
SERVER_REQUESTS: dict[str, type[Request]] = {
    **WORKER_REQUESTS, ExitRequest.op: ExitRequest, InjectRequest.op: InjectRequest}


def decode_request(obj: Any, kinds: Mapping[str, type[Request]] = WORKER_REQUESTS) -> Request:
    """The request ``obj`` (a decoded JSON object) holds, or ProtocolError."""
    if not isinstance(obj, dict):
        raise ProtocolError("request", f"it is a {type(obj).__name__}, not a JSON object",
                            "send one JSON object per frame")
    op = obj.get("op")
    cls = kinds.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ProtocolError(f"request op {_short(op)}", "unknown op",
                            f"use one of {', '.join(kinds)}")
    req = cls(**_fields(cls, obj, f"request {op}", skip=("op",)))
    req.check()
    return req


def echo_of(obj: Any) -> tuple[str | None, int | None]:
    """(op, seq) of a request that failed to decode, where they are well typed (for the reply)."""
    if not isinstance(obj, dict):
        return None, None
    op, seq = obj.get("op"), obj.get("seq")
    return (op if _str(op) else None), (seq if _int(seq) else None)


# -- replies -------------------------------------------------------------------------------------
@dataclass(slots=True, kw_only=True)
class Reply:
    """A worker's answer. Every reply echoes ``op`` and ``seq`` and names its ``worker``; the
    device's ``free``/``total`` (and ``held``) bytes come where the device reports them. The
    other fields belong to particular ops (see :mod:`workbench.core.worker`)."""

    status: Status
    op: str | None = None
    seq: int | None = None
    worker: str | None = None
    free: int | None = None
    total: int | None = None
    held: int | None = None
    error_type: ErrorType | None = None
    message: str | None = None
    newly_mapped: list[int] | None = None  # map
    quarantined: list[int] | None = None
    state: str | None = None  # prepare/commit/abort: prepared, committed, aborted
    early: bool | None = None  # abort before its prepare
    epoch: int | None = None  # barrier, state
    mapped: list[int] | None = None  # state
    retained: list[int] | None = None  # state
    pending: str | None = None  # state: the pending txid
    failed: str | None = None  # state: why the worker failed

    @classmethod
    def ok(cls, **fields: Any) -> Reply:
        return cls(status=Status.OK, **fields)

    @classmethod
    def error(cls, error_type: ErrorType, message: str, **fields: Any) -> Reply:
        return cls(status=Status.ERROR, error_type=error_type, message=message[:MAX_STR],
                   **fields)

    @property
    def is_ok(self) -> bool:
        return self.status is Status.OK

    def to_json(self) -> dict[str, Any]:
        return _wire(self)

    @classmethod
    def from_json(cls, obj: Any) -> Reply:
        if not isinstance(obj, dict):
            raise ProtocolError("reply", f"it is a {type(obj).__name__}, not a JSON object",
                                "answer with one JSON object per frame")
        reply = cls(**_fields(cls, obj, "reply"))
        if (reply.status is Status.ERROR) != (reply.error_type is not None):
            raise ProtocolError("reply", f"status {reply.status} with error_type "
                                f"{reply.error_type}", "an error reply, and only an error "
                                "reply, names its error_type")
        return reply


def reply_or_raw(obj: Any) -> Reply | Any:
    """A typed reply, or ``obj`` itself where it is not one (the coordinator reports it as a
    malformed reply: the outcome at that target is unknown)."""
    try:
        return Reply.from_json(obj)
    except ProtocolError:
        return obj
