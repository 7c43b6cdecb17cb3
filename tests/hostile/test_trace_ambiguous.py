"""Ambiguous input is refused, not guessed: a JSON object naming a key twice (a trace line, a
worker frame), a tag freed twice, freed without an alloc or allocated again while it holds blocks,
and a command option that is no number (``nan``) or out of its range; what cannot be known before
running (a tagged alloc that missed) is said, not answered 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from workbench.cli import app, kvctl
from workbench.core.replay import replay
from workbench.core.trace import load_trace
from workbench.errors import ConfigError
from workbench.sim.device import SimDevice
from workbench.strictjson import AmbiguousJSON, loads

ROOT = Path(__file__).parents[2]
POOL = {"op": "pool", "pool": "a", "num_blocks": 64}
keys = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=6)
values = st.one_of(st.integers(-5, 300), st.text(max_size=4), st.booleans(), st.none())


def dup_object(draw, key: str, first, second, others: dict) -> str:
    items = [json.dumps(k) + ": " + json.dumps(v) for k, v in others.items() if k != key]
    at = draw(st.integers(0, len(items)))
    items.insert(at, json.dumps(key) + ": " + json.dumps(second))
    items.insert(draw(st.integers(0, at)), json.dumps(key) + ": " + json.dumps(first))
    return "{" + ", ".join(items) + "}"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_key_named_twice_anywhere_is_refused(data):
    key = data.draw(keys)
    text = dup_object(data.draw, key, data.draw(values), data.draw(values),
                      data.draw(st.dictionaries(keys, values, max_size=4)))
    if data.draw(st.booleans()):  # nested inside another object or a list
        text = '{"outer": [' + text + "]}"
    with pytest.raises(AmbiguousJSON, match="appears twice"):
        loads(text)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_trace_line_with_a_duplicate_key_is_refused_with_its_line(tmp_path_factory, data):
    op = data.draw(st.sampled_from([
        ("alloc", {"pool": "a", "n": 1, "tag": "t"}, "n", 1, 200),
        ("pool", {"pool": "b", "num_blocks": 64}, "num_blocks", 64, 4096),
        ("limit", {"pool": "a", "bytes": "8MiB"}, "bytes", "8MiB", "2MiB"),
        ("free", {"pool": "a", "ids": [1]}, "ids", [1], [2]),
    ]))
    kind, fields, key, first, second = op
    line = dup_object(data.draw, key, first, second, {"op": kind, **fields})
    lines = [json.dumps(POOL)] * data.draw(st.integers(1, 3)) if kind != "pool" else []
    lines = lines[:1] + [line]
    path = tmp_path_factory.mktemp("t") / "t.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(ConfigError) as err:
        load_trace(path)
    msg = str(err.value)
    assert f"{path}:{len(lines)}: ambiguous JSON" in msg and f'"{key}" appears twice' in msg
    assert "\n" not in msg


def test_nan_and_infinity_in_a_trace_are_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"op": "pool", "pool": "a", "gpu_utilization": NaN}')
    with pytest.raises(ConfigError, match="NaN is not a JSON number"):
        load_trace(path)


A, F = ({"op": "alloc", "pool": "a", "n": 2, "tag": "t"}, {"op": "free", "pool": "a", "tag": "t"})
tag_ops = st.lists(st.sampled_from(["alloc", "free"]), min_size=1, max_size=8)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(seq=tag_ops)
def test_a_tag_is_freed_exactly_once_per_alloc_or_the_trace_is_refused(seq):
    """Any order of allocs and frees of one tag: the trace runs iff they alternate starting with
    an alloc; otherwise the first line that breaks it is refused, before anything runs."""
    ops = [POOL] + [dict(A if s == "alloc" else F) for s in seq]
    live, bad = False, None
    for i, s in enumerate(seq, 2):
        if (s == "alloc") == live:
            bad = i
            break
        live = not live
    if bad is None:
        r = replay(ops, SimDevice)
        assert [x.result for x in r.results[1:]] == [2] * len(seq)
        return
    with pytest.raises(ConfigError) as err:
        replay(ops, SimDevice)
    msg = str(err.value)
    assert msg.startswith(f"trace:{bad}: tag 't' of pool 'a' ")
    assert any(w in msg for w in ("never allocated", "already freed", "still holds")), msg


def test_a_free_of_a_tag_whose_alloc_missed_says_so():
    ops = [POOL, {"op": "alloc", "pool": "a", "n": 10_000, "tag": "t"}, F]
    r = replay(ops, SimDevice)
    assert r.results[1].result is None  # the miss
    res = r.results[2].result
    assert res["error"] == "ConfigError" and "line 2 missed" in res["message"]
    assert "nothing was freed" in res["message"]


def test_the_reported_trace_cases_in_a_real_process(tmp_path):
    trace = tmp_path / "t.jsonl"
    for body, words in ([POOL, '{"op": "alloc", "pool": "a", "n": 1, "n": 200}'],
                        '"n" appears twice'), ([POOL, F], "never allocated"), \
            ([POOL, A, F, F], "already freed on line 3"):
        trace.write_text("\n".join(b if isinstance(b, str) else json.dumps(b) for b in body))
        r = subprocess.run([sys.executable, "-m", "workbench", "replay", str(trace)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr


OPTS = [(["watch", "--count", "1"], "--interval"), (["watch", "--count", "1"], "--duration"),
        (["watch"], "--count"), (["limit", "p", "8MiB"], "--wait"),
        (["limit-percent", "p", "50"], "--wait")]
bad_numbers = st.one_of(
    st.sampled_from(["nan", "-nan", "inf", "-inf", "-1", "-0.5", "1e9", "1e400", "x", "", "0x1"]),
    st.floats(max_value=-1e-9).map(repr), st.floats(min_value=1e8).map(repr))


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(OPTS), value=bad_numbers)
def test_kvctl_time_options_refuse_what_is_no_time_in_one_line(case, value):
    args, opt = case
    spec = {"--interval": kvctl.INTERVAL, "--duration": kvctl.DURATION, "--count": kvctl.COUNT,
            "--wait": kvctl.WAIT}[opt]
    try:
        spec.check(value, opt)
        return  # in range (1e9 samples is a count): not this test's business
    except ConfigError:
        pass
    r = CliRunner().invoke(app, ["kvctl", *args, f"{opt}={value}"])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {opt} "), \
        (r.output, r.exception)
