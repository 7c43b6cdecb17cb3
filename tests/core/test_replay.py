"""Op-trace replay, the documented three-instance scenario, and determinism."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
