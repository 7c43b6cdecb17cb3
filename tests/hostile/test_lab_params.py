"""Every lab parameter has a declared range (its dataclass's ``RANGES``, checked by
``workbench.labs.kit.params``): a hostile value -- ``nan``, ``inf``, a negative or zero count,
``10**12``, a fraction for an integer, a word, an empty list, an unknown choice, a control
character -- is refused in one line naming the lab, the parameter and the value, before the lab's
run is entered, whether it comes typed (``Lab.params``), as text (``Lab.parse_params``), in a
dataclass built by hand (``run_lab``) or on the command line (``labs run --param``). The
parameters are enumerated from the declarations, so a new one is covered without a new test."""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from workbench import labs as registry
from workbench.cli import app
from workbench.errors import ConfigError
from workbench.labs import LABS, get_lab
from workbench.labs.kit.params import specs
from workbench.ranges import Choice, Choices, Flag, Floats, Ints, Num, Opt, Pairs, Text

SLOW = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture]
PARAMS = [(name, key) for name in LABS for key in specs(get_lab(name).params_type)]
CONTROL = ["\x00", "\x07", "\x1b[31m", "\x7f", "1\x00", "vllm\x00", "a\nb"]
WORDS = ["nan", "-nan", "NaN", "inf", "-inf", "1e400", "", "x", "bogus", "1,x", "0x10", "--",
         "1;2", "none?", *CONTROL]


def _spec(name: str, key: str):
    return specs(get_lab(name).params_type)[key]


def _inner(spec):
    return spec.spec if isinstance(spec, Opt) else spec


def _not_accepted(spec, text: str) -> bool:
    try:
        spec.check(text.strip(), "probe")  # the command line strips --param values
    except ConfigError:
        return True
    return False


def num_values(spec: Num) -> st.SearchStrategy:
    """Numbers (and their text) outside ``spec``: non-finite, below, above, fractions."""
    below = st.floats(max_value=spec.lo, allow_nan=False, allow_infinity=False) \
        .filter(lambda v: v < spec.lo)
    above = st.floats(min_value=spec.hi, allow_nan=False, allow_infinity=False) \
        .filter(lambda v: v > spec.hi)
    out = [st.sampled_from([math.nan, math.inf, -math.inf, 10**12, -1, 10**12 + 0.5]), below,
           above, st.integers(math.floor(spec.hi) + 1, 1 << 80),
           st.integers(-(1 << 80), math.ceil(spec.lo) - 1)]
    if spec.kind is int:
        out.append(st.floats(spec.lo, spec.hi).filter(lambda v: not v.is_integer()))
    return st.one_of(out).filter(lambda v: not spec.lo <= v <= spec.hi or
                                 (spec.kind is int and not float(v).is_integer())
                                 or not math.isfinite(v))


def hostile(spec) -> st.SearchStrategy:
    """Values ``spec`` must refuse, typed or as text (the test passes both forms)."""
    optional, spec = isinstance(spec, Opt), _inner(spec)  # an optional one takes None
    words = st.sampled_from(WORDS)
    if isinstance(spec, Num):
        return st.one_of(num_values(spec), num_values(spec).map(repr), words,
                         st.sampled_from([True, [], (1,), {}]))
    if isinstance(spec, (Ints, Floats)):
        lo, hi = spec.lo, spec.hi
        bad = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, 10**12]),
                        st.integers(math.floor(hi) + 1, 1 << 70),
                        st.integers(-(1 << 70), math.ceil(lo) - 1))
        if isinstance(spec, Ints):
            bad = st.one_of(bad, st.sampled_from([2.5, 0.5]))
        return st.one_of(words, bad.map(lambda v: (lo, v)), bad.map(lambda v: f"{lo},{v!r}"),
                         st.just(()), st.just([]), st.just(",".join([str(lo)] *
                                                                   (spec.max_len + 1))))
    if isinstance(spec, (Choice, Choices)):
        unknown = st.text(max_size=12).filter(lambda v: _not_accepted(spec, v))
        lists = unknown.map(lambda v: (spec.values[0], v)) if isinstance(spec, Choices) \
            else st.just(3)
        return st.one_of(words.filter(lambda v: _not_accepted(spec, v)), unknown, lists,
                         st.just(()), st.just(None) if isinstance(spec, Choices)
                         and not optional else st.just(1))
    if isinstance(spec, Flag):
        return st.one_of(st.sampled_from(["maybe", "2", "-1", "nan", "", "truee", *CONTROL]),
                         st.sampled_from([2, 0.5, math.nan, [], "yes please"]))
    if isinstance(spec, Text):
        return st.one_of(st.sampled_from(CONTROL), st.just("a" * (spec.max_len + 1)),
                         st.sampled_from([3, 2.5, b"x", ()]))
    assert isinstance(spec, Pairs), f"no hostile values for {spec!r}"
    key = next(iter(spec.keys))
    return st.one_of(words, st.sampled_from([f"{key}=nan", f"{key}=-1", f"{key}=", "banana=1",
                                             f"{key}=1e12", f"{key}", f"{key}=0.5,x=1"]),
                     st.just(5))


@pytest.fixture
def never_run(monkeypatch):
    """Entering any lab's run fails the test: a refusal must come before it."""
    def boom(self, *a, **kw):
        raise AssertionError(f"lab {self.name} ran with a refused parameter")
    for name in LABS:
        monkeypatch.setattr(type(get_lab(name)), "run", boom)


def _one_line(err: ConfigError, name: str, key: str) -> None:
    text = str(err)
    assert "\n" not in text and f"lab {name!r} parameter {key}=" in text, text


def test_every_field_of_every_lab_declares_its_range():
    for name in LABS:
        kind = get_lab(name).params_type
        fields = {f.name for f in dataclasses.fields(kind)}
        assert fields == set(specs(kind)), (name, fields ^ set(specs(kind)))


@pytest.mark.parametrize("name", list(LABS))
def test_every_default_passes(name, never_run):
    lab = get_lab(name)
    default = lab.params()
    assert lab.check_params(default) == default
    for key, spec in specs(lab.params_type).items():  # the typed default, and as text
        value = getattr(default, key)
        assert spec.check(value, key) == value
        if value is not None and not isinstance(value, tuple):
            assert lab.parse_params({key: str(value)}) == lab.params(**{key: value})


@pytest.mark.parametrize("which", PARAMS, ids=[f"{n}-{k}" for n, k in PARAMS])
@settings(max_examples=12, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_hostile_values_are_refused_typed_as_text_and_by_hand(data, which, never_run):
    name, key = which
    lab = get_lab(name)
    value = data.draw(hostile(_spec(name, key)))
    with pytest.raises(ConfigError) as typed:
        lab.params(**{key: value})
    _one_line(typed.value, name, key)
    text = value if isinstance(value, str) else ",".join(map(repr, value)) \
        if isinstance(value, (list, tuple)) else repr(value)
    if not isinstance(value, (bool, dict, bytes)) and _not_accepted(_spec(name, key), text):
        with pytest.raises(ConfigError) as parsed:
            lab.parse_params({key: text})
        _one_line(parsed.value, name, key)
    by_hand = dataclasses.replace(lab.params(), **{key: value})  # skips Lab.params
    with pytest.raises(ConfigError) as run:
        registry.run_lab(name, by_hand)
    _one_line(run.value, name, key)


@pytest.mark.parametrize("which", PARAMS, ids=[f"{n}-{k}" for n, k in PARAMS])
@settings(max_examples=3, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_hostile_values_are_refused_on_the_command_line(data, which, never_run):
    name, key = which
    value = data.draw(hostile(_spec(name, key)).filter(lambda v: isinstance(v, str)).filter(
        lambda v: _not_accepted(_spec(name, key), v) and "\x00" not in v))
    result = CliRunner().invoke(app, ["labs", "run", name, "--param", f"{key}={value}"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"parameter {key}=" in errors[0] and name in errors[0], \
        result.output


@pytest.mark.parametrize(("name", "args", "key"), [
    ("colocation", ["--param", "budget_gib=nan"], "budget_gib"),
    ("colocation", ["--param", "workers=-3"], "workers"),
    ("colocation", ["--peaks", "-4,2"], "peaks"),
    ("colocation", ["--steptime", "bogus"], "steptime"),
    ("colocation", ["--seed", "-1"], "seed"),
    ("baseline", ["--param", "rates="], "rates"),
    ("baseline", ["--param", "num_requests=1000000000000"], "num_requests"),
    ("kv-capacity", ["--param", "mem_gib=25e9"], "mem_gib"),
    ("prefix-bound", ["--param", "engine=bogus"], "engine"),
])
def test_the_reported_values_are_refused_in_one_line(name, args, key, never_run):
    result = CliRunner().invoke(app, ["labs", "run", name, *args])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"lab {name!r} parameter {key}=" in errors[0], result.output
    assert "Fix: pass" in errors[0]


def test_a_notebook_call_is_refused_like_the_command_line(never_run):
    lab = get_lab("colocation")
    with pytest.raises(ConfigError, match=r"budget_gib=nan: not a finite number.*0\.01 to"):
        registry.run_lab("colocation", lab.params(budget_gib=float("nan")))
    with pytest.raises(ConfigError, match="budget_gib=nan"):
        registry.run_lab("colocation", dataclasses.replace(lab.params(), budget_gib=math.nan))


SGLANG_RUNS = {"output-equality", "dynamic-limit", "grow-reclaim", "same-engine-pair"}


def test_a_lab_with_a_real_vllm_run_takes_engine_vllm():
    real = [name for name, target in LABS.items()
            if any(importlib.util.find_spec(target.split(":")[0].rsplit(".", 1)[0] + runner)
                   for runner in (".server", ".vllm"))]  # the server runner
    assert real  # kv-capacity, dynamic-limit, output-equality
    for name in real:
        values = set(_inner(_spec(name, "engine")).values)  # colocation: None = its default
        mini = importlib.util.find_spec(LABS[name].split(":")[0].rsplit(".", 1)[0] + ".mini")
        sglang = {"sglang"} if name in SGLANG_RUNS else set()  # engine=sglang: gpu only
        # the real kinds it names (its simulated kind and the old spellings besides)
        assert values & {"vllm", "mini", "sglang"} == ({"vllm", "mini"} if mini else {"vllm"}) \
            | sglang, name


def accepted(spec) -> st.SearchStrategy:
    """Values ``spec`` accepts (so a declared range never refuses what it names)."""
    spec = _inner(spec)
    if isinstance(spec, Num):
        if spec.kind is int:
            return st.integers(math.ceil(spec.lo), math.floor(spec.hi))
        return st.floats(spec.lo, spec.hi, allow_nan=False)
    if isinstance(spec, (Ints, Floats)):
        one = st.integers(spec.lo, spec.hi) if isinstance(spec, Ints) else \
            st.floats(spec.lo, spec.hi, allow_nan=False)
        return st.lists(one, min_size=1, max_size=spec.max_len).map(tuple)
    if isinstance(spec, Choice):
        return st.sampled_from(spec.values)
    if isinstance(spec, Choices):
        return st.lists(st.sampled_from(spec.values), min_size=1, max_size=spec.max_len) \
            .map(tuple)
    if isinstance(spec, Flag):
        return st.booleans()
    if isinstance(spec, Text):
        return st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1,
                       max_size=40)
    return st.sampled_from(spec.names)


@pytest.mark.parametrize("which", PARAMS, ids=[f"{n}-{k}" for n, k in PARAMS])
@settings(max_examples=6, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_values_in_range_are_accepted_typed_and_as_text(data, which):
    name, key = which
    lab = get_lab(name)
    value = data.draw(accepted(_spec(name, key)))
    typed = getattr(lab.params(**{key: value}), key)
    assert typed == value
    text = ",".join(map(repr, value)) if isinstance(value, tuple) else \
        value if isinstance(value, str) else repr(value)
    if not isinstance(value, tuple) or not isinstance(value[0], str):
        assert getattr(lab.parse_params({key: text}), key) == typed
    else:
        assert getattr(lab.parse_params({key: ",".join(value)}), key) == typed
    assert lab.check_params(lab.params(**{key: value})) == lab.params(**{key: value})
