"""The typed TP/PP messages: JSON round trips (property-based) and exact refusals."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.tpp.helpers import BPP, sim_pool
from workbench.core.device import VMM_OPS
from workbench.core.messages import (
    SERVER_REQUESTS,
    AbortRequest,
    BarrierRequest,
    CommitRequest,
    ErrorType,
    InjectRequest,
    MapRequest,
    PrepareRequest,
    Reply,
    Status,
    decode_request,
    reply_or_raw,
)
from workbench.errors import ProtocolError, WorkbenchError

_seq = st.none() | st.integers(-(2**40), 2**63)
_pages = st.lists(st.integers(0, 2**31), max_size=8)
_txid = st.text(min_size=1, max_size=40)
_ops = st.sampled_from(["map", "unmap", "prepare", "commit", "abort", "barrier", "state"])

REQUESTS = st.one_of(
    st.builds(MapRequest, seq=_seq, pages=_pages),
    st.builds(PrepareRequest, seq=_seq, txid=_txid, pages=_pages, commit=st.booleans()),
    st.builds(CommitRequest, seq=_seq, txid=_txid),
    st.builds(AbortRequest, seq=_seq, txid=_txid),
    st.builds(BarrierRequest, seq=_seq, epoch=st.integers(-1, 2**40)),
    st.builds(InjectRequest, seq=_seq,
              device=st.dictionaries(st.sampled_from(VMM_OPS), st.integers(1, 100), max_size=3),
              drop_reply=st.none() | _ops, stall=st.none() | _ops,
              seconds=st.floats(0, 60), die_after=st.none() | _ops),
    *(st.builds(cls, seq=_seq) for op, cls in SERVER_REQUESTS.items()
      if op in ("state", "ping", "close", "exit")),
)

_opt_pages = st.none() | _pages
REPLIES = st.one_of(
    st.builds(Reply.ok, op=_ops, seq=_seq, worker=st.text(max_size=12),
              free=st.none() | st.integers(0, 2**50), total=st.none() | st.integers(0, 2**50),
              newly_mapped=_opt_pages, state=st.none() | st.sampled_from(
                  ["prepared", "committed", "aborted"]), early=st.none() | st.booleans(),
              epoch=st.none() | st.integers(-1, 99), mapped=_opt_pages, retained=_opt_pages,
              pending=st.none() | _txid, failed=st.none() | st.text(max_size=30)),
    st.builds(Reply.error, st.sampled_from(ErrorType), st.text(max_size=200), op=_ops,
              seq=_seq, quarantined=_opt_pages, newly_mapped=_opt_pages),
)


@given(REQUESTS)
def test_request_json_round_trip(req):
    wire = json.loads(json.dumps(req.to_json()))
    assert decode_request(wire, SERVER_REQUESTS) == req
    assert wire["op"] == req.op


@given(REPLIES)
def test_reply_json_round_trip(reply):
    assert Reply.from_json(json.loads(json.dumps(reply.to_json()))) == reply


@given(REQUESTS, st.data())
def test_any_field_dropped_added_or_mistyped_is_refused(req, data):
    wire = req.to_json()
    fields = [k for k in wire if k != "op"]
    required = [f for f in fields if f in ("pages", "txid", "epoch")]
    change = data.draw(st.sampled_from(["extra", "mistype", "drop"] if required else
                                       ["extra", "mistype"] if fields else ["extra"]))
    if change == "extra":
        wire["surplus"] = 1
    elif change == "drop":
        del wire[data.draw(st.sampled_from(required))]
    else:
        wire[data.draw(st.sampled_from(fields))] = {"not": "a field value"}
    with pytest.raises(ProtocolError):
        decode_request(wire, SERVER_REQUESTS)


@pytest.mark.parametrize("wire, message", [
    ({"op": "evict"}, "request op 'evict': unknown op. Fix: use one of map, unmap, prepare, "
                      "commit, abort, barrier, state, ping, close, exit, inject"),
    ({"op": "map"}, "request map: field 'pages' is missing. Fix: send 'pages' (list[int])"),
    ({"op": "map", "pages": [1], "x": 2},
     "request map: unknown field(s) ['x']. Fix: send only the fields seq, pages"),
    ({"op": "commit", "txid": 5},
     "request commit: field 'txid' is 5, not str. Fix: send 'txid' as str"),
    ({"op": "inject", "device": {"create": 0}},
     "inject: device call create: k=0 is outside 1..1048576. Fix: fail the k-th next call, "
     "k >= 1"),
    (["map"], "request: it is a list, not a JSON object. Fix: send one JSON object per frame"),
])
def test_refusals_say_what_why_and_the_fix(wire, message):
    with pytest.raises(ProtocolError) as err:
        decode_request(wire, SERVER_REQUESTS)
    assert str(err.value) == message
    assert isinstance(err.value, WorkbenchError) and isinstance(err.value, ValueError)


def test_worker_only_kinds_refuse_process_ops():
    with pytest.raises(ProtocolError, match="unknown op"):
        decode_request({"op": "inject"})  # the state machine has no test hooks


@pytest.mark.parametrize("raw", [
    {"status": "success"},  # kvcached's ack: not one of ok/error/undelivered
    {"status": "error", "op": "map"},  # an error reply must name its error_type
    {"status": "ok", "op": "map", "error_type": "busy"},  # ... and only an error reply
    {"status": "error", "op": "map", "error_type": "gremlins", "message": "?"},
    {"status": "ok", "op": "map", "seq": 1, "newly_mapped": [1.0]},
    "ok",
])
def test_malformed_replies_stay_raw(raw):
    assert reply_or_raw(raw) is raw  # the coordinator reports it as a malformed reply
    with pytest.raises(ProtocolError):
        Reply.from_json(raw)


def test_undelivered_is_a_status_not_an_error_type():
    r = Reply(status=Status.UNDELIVERED, op="map", seq=3, message="connect failed")
    assert r.to_json() == {"status": "undelivered", "op": "map", "seq": 3,
                           "message": "connect failed"}
    assert Reply.from_json(r.to_json()) == r and not r.is_ok


def test_typed_and_json_state_replies_agree():
    c, fan, kv = sim_pool()
    ids = kv.alloc(2 * BPP)
    typed = fan.ping()  # typed replies, straight from the coordinator
    assert all(isinstance(r, Reply) and r.mapped == [0, 1, 2] for r in typed.values())
    assert fan.inconsistencies(typed) == fan.inconsistencies(c.states()) == []
    kv.free(ids)
    assert {str(t): r.mapped for t, r in fan.ping().items()} == {"pp0/w0": [0], "pp0/w1": [0]}
