"""Op-trace replay, the documented three-instance scenario, and determinism."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core import control
from workbench.core.events import Event, EventLog, PageState
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.core.replay import load_trace, replay
from workbench.errors import ConfigError
from workbench.sim.device import SimDevice

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "three_instances.jsonl"


def test_three_instances_move_pages_as_loads_alternate():
    r = replay(load_trace(EXAMPLE), SimDevice)
    in_use_by_phase = {}
    for res in r.results:
        assert not (isinstance(res.result, dict) and "error" in res.result), res
    # every instance mapped pages at some point, and gave them back when idle
    for pool in "abc":
        maps = [e for e in r.events if e.pool == pool and e.dst == "in_use"]
        unmaps = [e for e in r.events if e.pool == pool and e.src in ("in_use", "reserved")
                  and e.dst in ("free", "reclaimed")]
        assert maps, pool
        in_use_by_phase[pool] = len(maps)
        if pool != "a":
            assert unmaps, pool
    # b's second burst fits only because a gave its pages back first
    b_allocs = [x.result for x in r.results if x.op == "alloc" and x.pool == "b"]
    assert b_allocs == [300, 300]
    assert r.pools["c"].limit_bytes == 48 << 20 and r.pools["c"].mapped_bytes <= 48 << 20
    assert r.pools["a"].used_blocks == 600


def test_replay_is_deterministic_and_json():
    a = replay(load_trace(EXAMPLE), SimDevice)
    b = replay(load_trace(EXAMPLE), SimDevice)
    assert a.events.keys() == b.events.keys()
    assert [e.t for e in a.events] == [e.t for e in b.events]
    json.dumps(a.to_dict())


def test_faults_in_a_trace(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(o) for o in [
        {"op": "pool", "pool": "a", "num_layers": 2, "num_blocks": 640, "min_reserved": 0,
         "max_reserved": 0},
        {"op": "fail", "call": "map", "nth": 1},
        {"op": "alloc", "pool": "a", "n": 100, "tag": "x"},
        {"op": "alloc", "pool": "a", "n": 100, "tag": "y"},
        {"op": "free", "pool": "a", "tag": "y"},
    ]))
    r = replay(load_trace(trace), SimDevice)
    assert [x.result for x in r.results if x.op == "alloc"] == [None, 100]
    assert any(e.cause.startswith("map_failed") for e in r.events)


@pytest.mark.parametrize("line, words", [
    ('{"op": "explode"}', "unknown op"),
    ("not json", "not JSON"),
])
def test_bad_traces_say_what_is_wrong(tmp_path, line, words):
    trace = tmp_path / "bad.jsonl"
    trace.write_text(line + "\n")
    with pytest.raises(ConfigError, match=words):
        load_trace(trace)


def test_replay_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "workbench", "replay", str(EXAMPLE), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data["pools"]) == {"a", "b", "c"} and data["events"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op": "alloc", "pool": "nope", "n": 1}\n')
    r = subprocess.run([sys.executable, "-m", "workbench", "replay", str(bad), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "not created" in r.stdout
    r = subprocess.run([sys.executable, "-m", "workbench", "replay", str(EXAMPLE), "--backend",
                        "tpu"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown" in r.stderr


def test_bench_alloc_cli():
    r = subprocess.run([sys.executable, "-m", "workbench", "bench", "alloc", "--sizes", "1,16",
                        "--seconds", "0.05", "--repeats", "1", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"1", "16"} and all(v["allocs_per_s"] > 0 for v in data.values())
    r = subprocess.run([sys.executable, "-m", "workbench", "bench", "alloc", "--sizes", "x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "comma-separated" in r.stderr


# -- checked before anything runs ------------------------------------------------------------
def _trace(tmp_path, *ops) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in ops))
    return path


POOL = {"op": "pool", "pool": "a", "num_layers": 2, "num_blocks": 256}


@pytest.mark.parametrize("bad, message", [
    ({"op": "free", "pool": "a", "ids": [2.0]},
     "free ids=[2.0]: refused. Fix: use a list of block ids (integers from 0 to 1048576)"),
    ({"op": "alloc", "pool": "a", "n": True},
     "alloc n=True: refused. Fix: use an integer from 0 to 1048576"),
    ({"op": "alloc", "pool": "a", "n": 2.0},
     "alloc n=2.0: refused. Fix: use an integer from 0 to 1048576"),
    ({"op": "alloc", "pool": "a", "n": 1, "colour": "red"},
     "unknown field 'colour' for op 'alloc'. Fix: use only pool, n, tag"),
    ({"op": "limit", "pool": "a", "bytes": "1e400"},
     "limit bytes='1e400': refused. Fix: use a size from 0 to 4611686018427387903 bytes "
     "(a byte count or a string like \"64MiB\")"),
    ({"op": "limit", "pool": "a", "bytes": 1, "revision": 1 << 63},
     "limit revision=9223372036854775808: refused. Fix: use an integer from 0 to "
     "4611686018427387903"),
    ({"op": "free", "pool": "a"},
     "a free names either a tag or ids (exactly one). Fix: write \"tag\": \"r1\" or "
     "\"ids\": [3, 4]"),
    ({"op": "pool", "pool": "a"}, "pool 'a' is already created on line 1. Fix: give each pool "
     "its own name"),
    ({"op": "device", "preset": "h200"},
     "a device op is allowed only as the first op. Fix: move it to the top of the trace"),
    ({"op": "pool", "pool": "b", "page_size": "3MiB"},
     "pool page_size='3MiB': not a multiple of the 2 MiB page granularity. Fix: use a "
     "multiple of 2 MiB from 2 MiB to 1 GiB (e.g. 2MiB, 4MiB)"),
    ({"op": "fail", "call": "explode"}, "fail call='explode': refused. Fix: use one of "
     "\"reserve\", \"create\", \"map\", \"set_access\", \"unmap\", \"release\""),
    ([1, 2], "not a JSON object (list). Fix: write one {\"op\": ...} object per line"),
    ("{\"op\": \"alloc\", \"pool\": \"a\", \"n\": " + "9" * 5000 + "}",
     "not readable JSON (ValueError). Fix: write one JSON object per line"),
])
def test_a_bad_line_is_refused_by_number_before_anything_runs(tmp_path, bad, message):
    trace = _trace(tmp_path, POOL, {"op": "alloc", "pool": "a", "n": 1}, bad)
    with pytest.raises(ConfigError) as err:
        load_trace(trace)
    assert str(err.value) == f"{trace}:3: {message}"
    made = []
    with pytest.raises(ConfigError):  # the same ops handed to replay: refused, no device made
        replay([POOL, {"op": "alloc", "pool": "a", "n": 1}, bad],
               lambda **kw: made.append(SimDevice(**kw)) or made[-1])
    assert made == []


def test_cli_refuses_a_bad_line_in_one_line_with_exit_2(tmp_path):
    trace = _trace(tmp_path, POOL, {"op": "free", "pool": "a", "ids": [True]})
    r = subprocess.run([sys.executable, "-m", "workbench", "replay", str(trace)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"error: {trace}:2: free ids=[True]: refused. Fix: use a list of block "
                        f"ids (integers from 0 to 1048576)\n")


# -- closed pools, one segment per pool, nothing left after a failure -------------------------
def _ipc(tag: str) -> str:
    return f"wbtest_{tag}_{os.getpid()}_{secrets.token_hex(3)}"


def test_use_after_close_is_a_one_line_error_in_a_replay():
    r = replay([POOL, {"op": "alloc", "pool": "a", "n": 3, "tag": "x"},
                {"op": "close", "pool": "a"}, {"op": "alloc", "pool": "a", "n": 1},
                {"op": "free", "pool": "a", "tag": "x"}, {"op": "trim", "pool": "a"}], SimDevice)
    errors = [x.result for x in r.results[2:] if isinstance(x.result, dict)]
    closed = ("pool a is closed: close() gave its pages and reservation back. Fix: build a new "
              "pool, or drop the call")
    assert errors == [{"error": "PoolClosedError", "message": closed}] * 3


def test_two_pools_with_segments_each_keep_their_own():
    """Two pools with control segments on one EventLog (as a replay builds them): page events of
    b (256 page ids) never reach a's 4-page segment, and each segment mirrors its own pool."""
    log, dev = EventLog(), SimDevice()
    pools = [KVCacheManager(KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16,
                                       num_blocks=blocks), dev, name=name, events=log,
                            config=PoolConfig(ipc_name=_ipc(name), min_reserved_pages=1,
                                              max_reserved_pages=2))
             for name, blocks in (("a", 256), ("b", 16384))]
    a, b = pools
    try:
        assert b.alloc(16000) is not None and a.alloc(100) is not None
        for kv in pools:
            info = control.read_segment(kv.config.ipc_name)
            assert info.page_states == [st.value for st in kv.pages.state]
            assert info.used_blocks == kv.used_blocks
        assert a.geometry.num_pages < 16 < b.pages.counts[PageState.IN_USE]
    finally:
        for kv in pools:
            kv.close()
    assert all(control.read_segment(kv.config.ipc_name) is None for kv in pools)


def test_the_two_segment_trace_runs():
    ipc_a, ipc_b = _ipc("a"), _ipc("b")
    r = replay([{"op": "pool", "pool": "a", "num_blocks": 64, "ipc_name": ipc_a},
                {"op": "pool", "pool": "b", "num_blocks": 4096, "ipc_name": ipc_b},
                {"op": "alloc", "pool": "b", "n": 3000},
                {"op": "alloc", "pool": "a", "n": 10}], SimDevice)
    assert [x.result for x in r.results[2:]] == [3000, 10]
    assert control.read_segment(ipc_a) is None and control.read_segment(ipc_b) is None


def test_segment_subscriber_sees_only_its_pool():
    log = EventLog()
    got: list[str] = []
    off = log.subscribe(lambda e: got.append(e.pool), pool="b")
    for pool in "abab":
        log.emit(Event(0.0, pool, 1, "free", "in_use", "alloc"))
    off()
    log.emit(Event(0.0, "b", 1, "in_use", "free", "free"))
    assert got == ["b", "b"] and len(log) == 5


def _held(dev) -> tuple[dict, dict, dict]:
    return dev.allocations, dev.mappings, dev.reservations


@pytest.mark.parametrize("backend", ["sim", "host"])
def test_a_failed_replay_closes_every_pool_and_leaves_the_device_empty(backend):
    """The third pool cannot be created (its IPC name is taken by the second): the replay stops
    with one line, and the pools it opened, with their maps, handles and ranges, are gone."""
    made = []
    ipc = _ipc("dup")
    ops = [POOL, {"op": "alloc", "pool": "a", "n": 200, "tag": "x"},
           {"op": "pool", "pool": "b", "num_blocks": 128, "ipc_name": ipc},
           {"op": "alloc", "pool": "b", "n": 50},
           {"op": "fail", "call": "unmap", "nth": 1},  # pending: must not spoil the clean-up
           {"op": "pool", "pool": "c", "num_blocks": 64, "ipc_name": ipc},
           {"op": "alloc", "pool": "a", "n": 1}]
    with pytest.raises(ConfigError) as err:
        replay(ops, lambda **kw: made.append(make_device(backend, **kw)) or made[-1])
    assert str(err.value).startswith(f"line 6: IPC name {ipc!r}: in use by live process")
    assert "\n" not in str(err.value)
    assert _held(made[0]) == ({}, {}, {})
    assert control.read_segment(ipc) is None


def test_a_close_that_fails_midway_still_leaves_the_device_empty():
    """Every unmap and release of a close fails: the pool reports what it could not undo, and
    the replay still gives back every mapping, handle and range it made."""
    made = []
    faults = [{"op": "fail", "call": call, "nth": k} for call in ("unmap", "release")
              for k in range(1, 9)]
    r = replay([{**POOL, "layout": "per_layer"}, {"op": "alloc", "pool": "a", "n": 200},
                *faults, {"op": "close", "pool": "a"}],
               lambda **kw: made.append(SimDevice(**kw)) or made[-1])
    res = r.results[-1].result
    assert res["error"] == "DeviceError"
    assert res["message"].endswith("unreserve failed: range still has mappings")
    assert _held(made[0]) == ({}, {}, {})


def test_occupy_on_a_device_without_it_is_an_op_error():
    made = []
    r = replay([{"op": "occupy", "owner": "weights", "bytes": "4MiB"}],
               lambda **kw: made.append(make_device("host", **kw)) or made[-1])
    assert r.results[0].result == {
        "error": "ConfigError", "message": "line 1: occupy: this device holds no memory outside "
        "pools. Fix: use occupy on the sim or gpu backend only"}


def test_a_pool_the_device_cannot_hold_stops_the_replay_and_leaks_nothing():
    made = []
    with pytest.raises(ConfigError) as err:
        replay([{"op": "device", "preset": "h200", "capacity": "24MiB"}, POOL,
                {"op": "alloc", "pool": "a", "n": 10},
                {"op": "pool", "pool": "b", "num_layers": 4}],  # 16 MiB per page id: no room
               lambda **kw: made.append(SimDevice(**kw)) or made[-1])
    assert str(err.value) == ("line 4: pool 'b': could not back the null block's page. Fix: "
                              "free device memory or raise the memory limit")
    assert _held(made[0]) == ({}, {}, {})


def test_a_memory_limit_below_one_page_id_is_refused_at_load(tmp_path):
    trace = _trace(tmp_path, {**POOL, "memory_limit": "4MiB"})  # 0: the knob's own refusal
    with pytest.raises(ConfigError) as err:
        load_trace(trace)
    assert str(err.value) == (f"{trace}:1: memory_limit=4194304: below one page id (8388608 "
                              "bytes), "
                              "where the null block lives. Fix: raise it or leave it unset")


def test_a_pool_config_limit_is_clamped_to_capacity_or_refused():
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=256)
    dev = SimDevice()
    kv = KVCacheManager(geo, dev, config=PoolConfig(memory_limit=1 << 40))
    assert kv.limit_bytes == kv.capacity_bytes
    kv.close()
    with pytest.raises(ConfigError) as err:
        KVCacheManager(geo, dev, name="p", config=PoolConfig(memory_limit=4 << 20))
    assert str(err.value) == ("memory_limit=4194304 for pool 'p': limit 4194304 is below one "
                              "page id (8388608 bytes); the null block lives on page 0. Fix: "
                              "raise it to at least one page id or leave it unset")
    assert _held(dev) == ({}, {}, {})
