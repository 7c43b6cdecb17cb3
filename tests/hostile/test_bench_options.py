"""Every bench option has a declared type and range (``workbench.bench.params``): a value out of
it -- ``nan``, ``inf``, ``1e9``, ``0``, a fraction for an integer, a word, an unknown choice -- is
refused in one line naming the option, the value and the range, before anything runs (the bench
function is never entered), with exit status 2; the library functions refuse the same values."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from workbench.bench import params
from workbench.cli import app
from workbench.errors import ConfigError
from workbench.ranges import Choice, Ints, Num

ROOT = Path(__file__).parents[2]
RUNNERS = {"alloc": "workbench.bench.alloc.alloc_throughput",
           "overhead": "workbench.bench.overhead.run_overhead",
           "scale": "workbench.bench.scale.run_scale",
           "crossover": "workbench.bench.crossover.run_crossover"}
OPTIONS = [(b, p) for b, table in params.TABLES.items() for p in table if b != "vmm"]


def bad_values(spec) -> st.SearchStrategy[str]:
    words = st.sampled_from(["nan", "-nan", "inf", "-inf", "NaN", "", "x", "1,x", "0x10",
                             "1e400", "true", "--", "1;2"])
    if isinstance(spec, Num):
        below = st.floats(max_value=spec.lo, exclude_max=True, allow_nan=False,
                          allow_infinity=False).filter(lambda v: v < spec.lo)
        above = st.floats(min_value=spec.hi, exclude_min=True, allow_nan=False,
                          allow_infinity=False).filter(lambda v: v > spec.hi)
        out = [words, below.map(repr), above.map(repr),
               st.integers(int(spec.hi) + 1, 1 << 80).map(str),
               st.integers(-(1 << 80), math.ceil(spec.lo) - 1).map(str)]
        if spec.kind is int:
            out.append(st.floats(spec.lo, spec.hi).filter(lambda v: not v.is_integer()).map(repr))
        return st.one_of(out)
    if isinstance(spec, Ints):
        return st.one_of(words, st.integers(spec.hi + 1, 1 << 70).map(lambda v: f"1,{v}"),
                         st.integers(-(1 << 70), spec.lo - 1).map(str),
                         st.just(",".join(["1"] * (spec.max_len + 1))))
    assert isinstance(spec, Choice)
    return st.one_of(words, st.text(max_size=12).filter(lambda v: v not in spec.values))


@pytest.fixture
def never_run(monkeypatch):
    def boom(*a, **kw):
        raise AssertionError("a bench ran with a refused option")
    for target in RUNNERS.values():
        monkeypatch.setattr(target, boom)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_bench_option_refuses_out_of_range_values_in_one_line(never_run, data):
    bench, param = data.draw(st.sampled_from(OPTIONS))
    spec = params.TABLES[bench][param]
    value = data.draw(bad_values(spec))
    opt = "--" + param.replace("_", "-")
    r = CliRunner().invoke(app, ["bench", bench, f"{opt}={value}"])
    assert r.exit_code == 2, (r.output, r.exception)
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {opt} ") and "Fix: pass " in lines[0], lines
    assert spec.accepted() in lines[0]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_bench_functions_refuse_the_same_values(data):
    bench = data.draw(st.sampled_from(["alloc", "overhead", "scale"]))
    table = params.TABLES[bench]
    param = data.draw(st.sampled_from(list(table)))
    value = data.draw(st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, 1 << 40,
                                                 True, None, "3"]),
                                st.floats(allow_nan=True)))
    try:
        table[param].check(value, param)
    except ConfigError:
        pass
    else:
        return  # an accepted value: not this test's business
    from workbench.bench import alloc, overhead, scale

    call = {"alloc": lambda v: alloc.alloc_throughput(**{param: v}),
            "overhead": lambda v: overhead.run_overhead(**{param: v}),
            "scale": lambda v: (scale.run_scale([], repeats=v) if param == "repeats"
                                else scale.default_points(**{param: v}))}[bench]
    with pytest.raises(ConfigError) as err:
        call(value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args", [
    ["alloc", "--seconds", "nan"], ["alloc", "--seconds", "1e9"], ["overhead", "--pages", "0"],
    ["scale", "--requests", "1e9"], ["vmm", "--bw-gib", "1e6"], ["crossover", "--lens", "0"],
])
def test_the_reported_cases_end_at_once_in_a_real_process(args):
    r = subprocess.run([sys.executable, "-m", "workbench", "bench", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and args[1] in lines[0], r.stderr
    assert r.stdout == ""
