"""One rule per knob: the environment, ``PoolConfig(...)`` and a trace's ``pool`` line refuse a
bad value with the same ``why. Fix: ...``; hostile values are drawn for every knob of the table
itself, so a new knob is covered without a new test."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.config import PoolConfig
from workbench.core.trace import KNOB_FIELDS, check_op
from workbench.errors import ConfigError
from workbench.knobs import COUNT, FLAG, FRACTION, KNOBS, MAX_RESERVE, PATH, POOL_KNOBS, SIZE
from workbench.settings import Settings, var
from workbench.settings import settings as read_settings
from workbench.units import MiB

TRACE_FIELD = {knob: field for field, knob in KNOB_FIELDS.items()}
TRACED = [k for k in POOL_KNOBS if k.name in TRACE_FIELD]


def _env(name: str, text: str):
    room = _with_room(name, text, "min_reserved_pages", "max_reserved_pages")
    return read_settings({var(k): str(v) for k, v in room.items()})


def _code(name: str, value):
    return PoolConfig(**_with_room(name, value, "min_reserved_pages", "max_reserved_pages"))


def _trace(name: str, value):
    op = {"op": "pool", "pool": "p",
          **_with_room(TRACE_FIELD[name], value, "min_reserved", "max_reserved")}
    return check_op(op, "t.jsonl:1")


def _with_room(field: str, value, low: str, high: str) -> dict:
    """The field, and the other reserve bound wide open: the cross-knob rule stays out of it."""
    return {field: value, **({high: MAX_RESERVE} if field == low else {}),
            **({low: 0} if field == high else {})}


def _refusal(fn, *args) -> ConfigError | None:
    try:
        fn(*args)
    except ConfigError as err:
        return err
    return None


# (knob, the value in code and in a trace, the same value as environment text)
SAME_BAD_VALUE = [
    ("page_size", 3 * MiB, "3MiB"),
    ("page_size", 2 << 30, "2GiB"),
    ("memory_limit", 0, "0"),
    ("memory_limit", 5 * MiB, "5MiB"),
    ("min_reserved_pages", -1, "-1"),
    ("max_reserved_pages", MAX_RESERVE + 1, str(MAX_RESERVE + 1)),
    ("gpu_utilization", 5e-324, "5e-324"),  # a denormal
    ("gpu_utilization", math.nan, "nan"),
    ("gpu_utilization", math.inf, "inf"),
    ("gpu_utilization", 1.5, "1.5"),
    ("ipc_name", "../etc", "../etc"),
    ("ipc_name", "llama\n", "llama\n"),
]


@pytest.mark.parametrize("name, value, text", SAME_BAD_VALUE)
def test_the_same_bad_value_gets_the_same_line_from_env_code_and_trace(name, value, text):
    knob = KNOBS[name]
    env, code, trace = (_refusal(_env, name, text), _refusal(_code, name, value),
                        _refusal(_trace, name, value))
    assert env is not None and code is not None and trace is not None
    tail = f"{env.why}. Fix: use {knob.accepted}"
    for err in (env, code, trace):
        assert "\n" not in str(err) and str(err).endswith(": " + tail), str(err)
    assert env.what.startswith(f"{var(name)}=")
    assert code.what.startswith(f"{name}=")
    assert trace.what.startswith(f"t.jsonl:1: pool {TRACE_FIELD[name]}=")


def test_the_one_rule_message_reads_as_one_line():
    err = _refusal(_code, "page_size", 3 * MiB)
    assert str(err) == ("page_size=3145728: not a multiple of the 2 MiB page granularity. Fix: "
                        "use a multiple of 2 MiB from 2 MiB to 1 GiB (e.g. 2MiB, 4MiB)")
    assert str(_refusal(_env, "page_size", "3MiB")).startswith("WORKBENCH_KV_PAGE_SIZE='3MiB': "
                                                               "not a multiple of the 2 MiB")


def test_every_knob_is_a_setting_and_every_pool_knob_a_pool_config_field():
    assert [f.name for f in dataclasses.fields(Settings) if f.name != "given"] == list(KNOBS)
    assert {f.name for f in dataclasses.fields(PoolConfig)} == {k.name for k in POOL_KNOBS}
    assert PoolConfig() == PoolConfig(**{k.name: k.default for k in POOL_KNOBS})
    assert read_settings({}) == Settings(**{k: KNOBS[k].default for k in KNOBS})


def test_unicode_digits_and_blanks_are_not_ascii_numbers():
    for text in ("٣", "３", "1_0", "\u20035", "5\u00a0", "２MiB", "0x10", "+5", "5.", "1e3"):
        err = _refusal(_env, "min_reserved_pages", text)
        assert err is not None and err.why == "not an integer", text
    for text in ("٠.٥", "０.５", "0,5", "1_0", "0.5\u2003"):
        assert _refusal(_env, "gpu_utilization", text).why == "not a number", text
    for text in ("٢MiB", "２MiB", "2\u00a0MiB"):
        assert _refusal(_env, "page_size", text).why == "not a size", text
    assert _env("max_reserved_pages", " 7\t").max_reserved_pages == 7  # ASCII blanks are fine


HOSTILE_TEXT = st.one_of(
    st.sampled_from(["", " ", "\t", "\n", "nan", "NaN", "inf", "-inf", "Infinity", "-1", "-0",
                     "0", "1", "1e400", "5e-324", "1e-310", "9" * 45, "9" * 19, "-" + "9" * 25,
                     "٣", "３", "٣MiB", "３２MiB", "1_000", "0x10", "2MiB", "4MiB", "3MiB",
                     "1.5G", "yes", "off", "TRUE", "ｔｒｕｅ", "relative/dir", "./x", "~/x",
                     "/", "/tmp", "/tmp/\x00x", "/no/such/dir", "llama_a", "..", "a/b",
                     "0.95", "0.5", "1.0000001", " 8G ", "8 G", "\u20038"]),
    st.text(max_size=24),
    st.integers(-(1 << 80), 1 << 80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
HOSTILE_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 80), 1 << 80),
    st.floats(allow_nan=True, allow_infinity=True), HOSTILE_TEXT,
    st.sampled_from([[], {}, [1], 2.0, 1 << 21, 2 * MiB, 3 * MiB, 5e-324, -0.0]),
)
NUMBERS = st.one_of(st.integers(-(1 << 70), 1 << 70), st.sampled_from([0, -1, MAX_RESERVE]))
FRACTIONS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                      st.sampled_from([5e-324, 1e-310, 0.01, 0.0099, 1.0, 1.0000001, -0.0]))


def _in_range(knob, value) -> None:
    """What an accepted value of ``knob`` must be, read from the knob itself."""
    if value is None:
        assert knob.unset_ok
    elif knob.kind in (SIZE, COUNT):
        assert type(value) is int and knob.lo <= value <= knob.hi and value % knob.granule == 0
    elif knob.kind == FRACTION:
        assert type(value) is float and math.isfinite(value) and knob.lo <= value <= knob.hi
    elif knob.kind == FLAG:
        assert type(value) is bool
    elif knob.kind == PATH:
        assert value.startswith("/") and value.isprintable()
    else:
        assert KNOBS[knob.name].check(value) == value


def _same(a: ConfigError | None, b: ConfigError | None) -> None:
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        assert (a.why, a.fix) == (b.why, b.fix)


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(knob=st.sampled_from(list(KNOBS.values())), text=HOSTILE_TEXT)
def test_env_text_parses_into_range_or_is_one_line_naming_the_variable(knob, text):
    try:
        value = getattr(_env(knob.name, text), knob.name)
    except ConfigError as err:
        assert "\n" not in str(err) and err.what.startswith(var(knob.name) + "=")
        assert err.fix == f"use {knob.accepted}"
        return
    _in_range(knob, value)


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(knob=st.sampled_from(POOL_KNOBS), value=HOSTILE_VALUE)
def test_code_and_trace_take_or_refuse_a_typed_value_alike(knob, value):
    """Every pool knob in code; those a trace's pool line sets (``KNOB_FIELDS``) there too."""
    code = _refusal(_code, knob.name, value)
    trace = _refusal(_trace, knob.name, value) if knob in TRACED else code
    if code is None:  # a pool the knob allows may still be refused by the trace's geometry
        _in_range(knob, getattr(_code(knob.name, value), knob.name))
        assert trace is None or trace.fix != f"use {knob.accepted}", trace
        return
    assert "\n" not in str(code) and code.fix == f"use {knob.accepted}"
    _same(code, trace)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(knob=st.sampled_from([k for k in TRACED if k.kind in (SIZE, COUNT, FRACTION)]),
       data=st.data())
def test_a_number_written_out_is_judged_as_the_number(knob, data):
    """Environment text ``str(x)`` and the value ``x`` in code and in a trace: one outcome."""
    x = data.draw(FRACTIONS if knob.kind == FRACTION else NUMBERS)
    env, code, trace = (_refusal(_env, knob.name, repr(x)), _refusal(_code, knob.name, x),
                        _refusal(_trace, knob.name, x))
    _same(env, code)
    if code is None:
        assert getattr(_env(knob.name, repr(x)), knob.name) == getattr(_code(knob.name, x),
                                                                        knob.name)
    else:
        _same(code, trace)
