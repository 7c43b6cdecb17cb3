"""Hostile op traces: whatever a trace holds, ``replay`` ends in a result or in one typed,
one-line ConfigError, and the device it made holds nothing afterwards.

Traces are generated two ways: near-valid ones (known ops on two small pools, with faults,
occupy and control segments) where one line in a few is corrupted, and pure noise (random op
names, field names and values of every JSON type). The device is checked after every replay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from workbench.backends import make_device
from workbench.core import control
from workbench.core.replay import OPS, replay
from workbench.core.trace import load_trace
from workbench.errors import ConfigError

IPC = [f"wbhostile_{os.getpid()}_{i}" for i in range(2)]
POOLS = ["a", "b"]
CALLS = ["reserve", "create", "map", "set_access", "unmap", "release"]

junk = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
              st.sampled_from(["64MiB", "3MiB", "1e400", "-1", "8G", "0", "2.0", "a/b"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=2),
    max_leaves=6)
size = st.one_of(st.integers(0, 64 << 20), st.sampled_from(["2MiB", "4MiB", "16MiB", "1G"]))
pool_name = st.sampled_from(POOLS)


def _valid_ops() -> st.SearchStrategy[dict]:
    pool = st.fixed_dictionaries(
        {"op": st.just("pool"), "pool": pool_name},
        optional={"num_layers": st.integers(1, 3), "num_blocks": st.integers(2, 300),
                  "block_size": st.sampled_from([16, 32]), "layout": st.sampled_from(
                      ["contiguous", "per_layer"]), "min_reserved": st.integers(0, 2),
                  "max_reserved": st.integers(2, 3), "prealloc": st.booleans(),
                  "memory_limit": size, "ipc_name": st.sampled_from(IPC)})
    return st.one_of(
        pool,
        st.fixed_dictionaries({"op": st.just("alloc"), "pool": pool_name,
                               "n": st.integers(0, 400)},
                              optional={"tag": st.sampled_from(["x", "y"])}),
        st.fixed_dictionaries({"op": st.just("free"), "pool": pool_name,
                               "tag": st.sampled_from(["x", "y"])}),
        st.fixed_dictionaries({"op": st.just("free"), "pool": pool_name,
                               "ids": st.lists(st.integers(0, 400), max_size=4)}),
        st.fixed_dictionaries({"op": st.just("limit"), "pool": pool_name, "bytes": size},
                              optional={"revision": st.integers(0, 6)}),
        st.fixed_dictionaries({"op": st.sampled_from(["trim", "refill", "close"]),
                               "pool": pool_name}),
        st.fixed_dictionaries({"op": st.just("fail"), "call": st.sampled_from(CALLS)},
                              optional={"nth": st.integers(1, 4)}),
        st.fixed_dictionaries({"op": st.just("occupy"), "owner": st.sampled_from(["w", "v"]),
                               "bytes": size}))


def _corrupt(op: dict) -> st.SearchStrategy[dict]:
    """The op with one field replaced, added or dropped."""
    keys = sorted(op)
    return st.one_of(
        st.builds(lambda k, v: {**op, k: v}, st.sampled_from(keys), junk),
        st.builds(lambda k, v: {**op, k: v}, st.text(max_size=6), junk),
        st.sampled_from(keys).map(lambda k: {x: v for x, v in op.items() if x != k}))


valid = st.lists(_valid_ops(), max_size=20)
near_valid = st.lists(  # about one line in ten corrupted
    _valid_ops().flatmap(lambda op: st.integers(0, 9).flatmap(
        lambda k: _corrupt(op) if k == 0 else st.just(op))), max_size=14)
noise = st.lists(st.one_of(
    st.dictionaries(st.sampled_from(["op", "pool", "n", "ids", "tag", "bytes", "call",
                                     "nth", "owner", "ipc_name", "revision", "zzz"]),
                    junk, max_size=4).map(lambda d: d if d.get("op") is None else d),
    st.builds(lambda o, d: {"op": o, **d}, st.sampled_from(OPS),
              st.dictionaries(st.text(max_size=8), junk, max_size=3)),
    junk), max_size=8)


def _run(ops: list, backend: str, note=event) -> None:
    """Replay ``ops``; ``note`` records which way it ended (hypothesis statistics)."""
    made = []

    def factory(**kw):
        made.append(make_device(backend, **kw))
        return made[-1]

    try:
        r = replay(ops, factory)
    except ConfigError as err:
        assert "\n" not in str(err) and "Fix: " in str(err), str(err)
        note("refused" if not made else "stopped")
    else:
        note("ran")
        for res in r.results:  # an op that failed says so in one line
            if isinstance(res.result, dict) and "error" in res.result:
                assert "\n" not in res.result["message"]
    for dev in made:
        assert (dev.allocations, dev.mappings, dev.reservations) == ({}, {}, {})
    assert all(control.read_segment(n) is None for n in IPC)


HOSTILE = settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))


@HOSTILE
@given(ops=near_valid)
def test_near_valid_traces_on_the_sim(ops):
    _run(ops, "sim")


@HOSTILE
@given(ops=valid)
def test_valid_traces_with_faults_on_the_sim(ops):
    _run(ops, "sim")


@HOSTILE
@given(ops=noise)
def test_noise_traces_on_the_sim(ops):
    _run(ops, "sim")


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=near_valid)
def test_near_valid_traces_on_the_host_device(ops):
    _run([op for op in ops if not (isinstance(op, dict) and op.get("op") == "occupy")], "host")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(st.one_of(st.text(max_size=30), junk.map(json.dumps)), max_size=6))
def test_any_file_loads_or_is_refused_in_one_line(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("t") / "t.jsonl"
    path.write_text("\n".join(lines))
    try:
        ops = load_trace(path)
    except ConfigError as err:
        assert "\n" not in str(err) and str(err).startswith(f"{path}:")
        return
    _run(ops, "sim")


def test_cli_hostile_trace_exits_2_in_one_line(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"op": "pool", "pool": "p1"}\n{"op": "alloc", "pool": "p1", "n": 1e999}\n')
    r = subprocess.run([sys.executable, "-m", "workbench", "replay", str(trace)],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"error: {trace}:2: ambiguous JSON (1e999 is past the largest float). "
                        "Fix: write one JSON object per line\n")


@pytest.mark.parametrize("backend", ["sim", "host"])
def test_a_replay_that_stops_leaves_the_other_pools_segments_gone(backend):
    ops = [{"op": "pool", "pool": "a", "ipc_name": IPC[0]},
           {"op": "alloc", "pool": "a", "n": 10},
           {"op": "pool", "pool": "b", "ipc_name": IPC[0]}]  # the name is taken: stops here
    with pytest.raises(ConfigError, match=r"^line 3: IPC name 'wbhostile_\d+_0': in use by "):
        replay(ops, lambda **kw: make_device(backend, **kw))
    _run(ops, backend, note=lambda _: None)


def test_a_fifo_is_refused_not_read(tmp_path):
    fifo = tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "workbench", "replay", str(fifo)],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (2, f"error: {fifo}: not a regular file. Fix: pass a "
                                           "trace file\n")


def test_a_device_line_replays_on_a_backend_without_presets():
    """A trace is shared between backends: the simulated GPU's preset is dropped by the device
    chooser on the host device, and its capacity is honoured."""
    made = []

    def build(**kw):
        made.append(make_device("host", **kw))
        return made[-1]

    replay([{"op": "device", "preset": "h200", "capacity": "4G"}], build)
    assert len(made) == 1 and made[0].mem_info().total == 4 << 30
