"""Records read back and written: one strict reader (no NaN/Infinity/1e999, no key named twice,
bounded depth, bounded inflated size) for colocation's ``from_dir`` and every file read back,
and one strict writer (a non-finite value is ``null``, named in the record's ``notes``)."""

from __future__ import annotations

import gzip
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import strictjson
from workbench.errors import ConfigError
from workbench.labs.colocation.lab import RECORDS, saved_record
from workbench.labs.colocation.params import read_sweep

SAVED = sorted(RECORDS.glob("*.repeats.json.gz"))[0]
TEXT = gzip.decompress(SAVED.read_bytes()).decode()
NUMBERS = [m.span() for m in re.finditer(r"(?<=[:\[, ])-?\d+\.\d+(?:e-?\d+)?(?=[,\]}])", TEXT)]
KEYS = [m.span() for m in re.finditer(r'\{"[a-z_]+":', TEXT)]
REP_TEXT = json.dumps(json.loads(TEXT)[0])
REP_NUMBERS = [m.span() for m in re.finditer(r"(?<=[:\[, ])-?\d+\.\d+(?:e-?\d+)?(?=[,\]}])",
                                             REP_TEXT)]
HOSTILE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]


def gz(path: Path, text: str) -> Path:
    path.write_bytes(gzip.compress(text.encode()))
    return path


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.integers(0, len(NUMBERS) - 1), token=st.sampled_from(HOSTILE))
def test_a_non_finite_number_anywhere_in_a_saved_sweep_is_refused(tmp_path, where, token):
    a, b = NUMBERS[where]
    with pytest.raises(ConfigError) as err:
        read_sweep(gz(tmp_path / "s.repeats.json.gz", TEXT[:a] + token + TEXT[b:]))
    assert "\n" not in str(err.value) and "is not strict JSON" in str(err.value)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.integers(0, len(REP_NUMBERS) - 1), token=st.sampled_from(HOSTILE))
def test_a_non_finite_number_anywhere_in_an_out_dirs_repeat_is_refused(tmp_path, where, token):
    a, b = REP_NUMBERS[where]
    (tmp_path / "repeat_0.json").write_text(REP_TEXT[:a] + token + REP_TEXT[b:])
    with pytest.raises(ConfigError) as err:
        read_sweep(tmp_path)
    assert "\n" not in str(err.value) and "is not strict JSON" in str(err.value)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.integers(0, len(KEYS) - 1))
def test_a_key_named_twice_anywhere_is_refused(tmp_path, where):
    a, b = KEYS[where]
    key = TEXT[a + 1:b]  # '"k":'
    bad = TEXT[:b] + "0," + key + TEXT[b:]  # {"k":0,"k":<the real value> ...
    with pytest.raises(ConfigError, match="appears twice"):
        read_sweep(gz(tmp_path / "s.repeats.json.gz", bad))


def test_from_dir_of_a_tampered_sweep_is_one_line_and_never_a_nanx_verdict(tmp_path):
    a, b = NUMBERS[len(NUMBERS) // 2]
    gz(tmp_path / "s.repeats.json.gz", TEXT[:a] + "NaN" + TEXT[b:])
    r = subprocess.run([sys.executable, "-m", "workbench", "labs", "run", "colocation",
                        "--backend", "host", "--param",
                        f"from_dir={tmp_path / 's.repeats.json.gz'}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and "NaN is not a JSON number" in r.stderr
    assert "nanx" not in r.stderr


@pytest.mark.parametrize("depth", [65, 2000, 200_000])
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path, depth):
    p = gz(tmp_path / "deep.repeats.json.gz", "[" * depth + "]" * depth)
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        read_sweep(p)


def test_a_gzip_bomb_is_refused_without_inflating_it(tmp_path):
    p = tmp_path / "bomb.repeats.json.gz"
    with gzip.open(p, "wb", compresslevel=9) as f:  # 80 MiB of spaces in about 80 KB
        block = b" " * (1 << 20)
        for _ in range(80):
            f.write(block)
    code = ("import resource, sys\n"
            "from workbench.errors import ConfigError\n"
            "from workbench.labs.colocation.params import read_sweep\n"
            "peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "before = peak()\n"
            "try:\n    read_sweep(sys.argv[1])\nexcept ConfigError as e:\n    print(e)\n"
            "print(peak() - before)\n")
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True,
                       timeout=300)
    why, grew_kib = r.stdout.strip().splitlines()
    assert "inflates past 32 MiB" in why, r.stderr
    assert int(grew_kib) < 72 * 1024  # the 32 MiB cap (and its copy), not 80 MiB


def test_the_saved_records_still_read():
    assert saved_record() is not None
    assert len(read_sweep(SAVED)) >= 1


@pytest.mark.parametrize("token", HOSTILE)
def test_every_record_reader_skips_a_non_finite_record(tmp_path, token):
    text = json.dumps(json.loads((RECORDS / saved_record()["_path"]).read_text()))
    a, b = next(m.span() for m in re.finditer(r"(?<=: )\d+\.\d+(?=[,}])", text))
    (tmp_path / "z.json").write_text(text[:a] + token + text[b:])
    assert saved_record(tmp_path) is None
    (tmp_path / "z.json").write_text(text)
    assert saved_record(tmp_path) is not None


# -- the writer -------------------------------------------------------------------------

values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5) |
                      st.floats(allow_nan=True, allow_infinity=True),
                      lambda inner: st.lists(inner, max_size=4) |
                      st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(obj=st.dictionaries(st.text(max_size=4).filter(lambda k: k != "notes"), values,
                           max_size=5))
def test_the_writer_is_strict_json_and_names_every_non_finite_value(obj):
    text = strictjson.dumps(obj)
    back = strictjson.loads(text)  # the strict reader takes it
    bad = []

    def walk(x, where):
        if isinstance(x, float) and not math.isfinite(x):
            bad.append(where)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{where}.{k}" if where else k)
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")

    walk(obj, "")
    assert [n.split(": ")[0] for n in back.get("notes", [])] == bad
    assert ("notes" in back) == bool(bad)


def test_cross_engines_record_has_no_nan_and_says_which_fields_are_null(tmp_path):
    out = tmp_path / "ce.json"
    r = subprocess.run([sys.executable, "-m", "workbench", "labs", "run", "cross-engine",
                        "--quick", "--out", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    rec = strictjson.loads(text)  # NaN would be refused here
    assert "NaN" not in text and rec["notes"]
    nulls = set()

    def walk(x, where):
        if x is None:
            nulls.add(where)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{where}.{k}" if where else k)
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")

    walk(rec, "")
    assert {n.split(": ")[0] for n in rec["notes"]} <= nulls
