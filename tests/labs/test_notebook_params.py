"""A notebook's ``run_lab(name, params)`` checks its params as the command line does: the lab's
own dataclass (each field in its declared range) or a mapping of its parameter names; anything
else -- another lab's params, a namespace, a number, NaN -- is one ConfigError line, and the
lab's runner is never reached."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import ConfigError
from workbench.labs import LABS, get_lab, run_lab

LABS_TRIED = ("baseline", "colocation", "kv-capacity", "tp-pp")


class Reached(Exception):
    """The runner was called: the params passed every check."""


@pytest.fixture
def guarded(monkeypatch):
    """Each tried lab's runners replaced by one that records what reached it."""
    seen: list = []

    def runner(params, run, progress=None):
        seen.append(params)
        raise Reached

    for name in LABS_TRIED:
        cls = type(get_lab(name))
        monkeypatch.setattr(cls, "runners", {f: runner for f in cls.runners})
    return seen


def _refused_or_valid(name: str, params, seen: list) -> None:
    lab = get_lab(name)
    before = len(seen)
    try:
        run_lab(name, params, "sim")
    except ConfigError as err:
        assert "\n" not in str(err) and len(seen) == before
        return
    except Reached:
        got = seen[-1]
        assert type(got) is lab.params_type
        assert lab.check_params(got) == got  # every field within its declared range
        return
    pytest.fail("the runner was neither reached nor refused")


OTHER = [get_lab(n).params() for n in LABS]
values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=8),
    st.lists(st.integers(), max_size=3), st.sampled_from(OTHER),
    st.builds(SimpleNamespace, seed=st.integers(), quick=st.booleans()),
    st.dictionaries(st.text(max_size=6), st.integers() | st.floats() | st.text(max_size=4),
                    max_size=3))


@pytest.mark.parametrize("name", LABS_TRIED)
def test_what_a_notebook_passes_is_checked_before_the_lab_starts(name, guarded):
    @settings(max_examples=60, deadline=None)
    @given(params=values)
    def check(params):
        if params is None:
            return  # None is "the defaults"
        _refused_or_valid(name, params, guarded)

    check()


@pytest.mark.parametrize("name", LABS_TRIED)
def test_a_mapping_of_the_labs_own_names_is_checked_value_by_value(name, guarded):
    lab = get_lab(name)
    fields = [f.name for f in dataclasses.fields(lab.params_type)]

    @settings(max_examples=60, deadline=None)
    @given(data=st.dictionaries(st.sampled_from(fields), st.integers(-3, 70_000) | st.floats()
                                | st.text(max_size=5) | st.booleans(), max_size=3))
    def check(data):
        _refused_or_valid(name, data, guarded)

    check()


@pytest.mark.parametrize("bad", [
    lambda lab: dataclasses.replace(lab.params(), seed=math.nan),
    lambda lab: dataclasses.replace(lab.params(), seed="three"),
    lambda lab: dataclasses.replace(lab.params(), quick="maybe"),
    lambda lab: get_lab("control-groups").params(),
    lambda lab: SimpleNamespace(**dataclasses.asdict(lab.params())),
    lambda lab: dataclasses.asdict(lab.params()) | {"budget": math.nan},
    lambda lab: {"seed": math.nan},
    lambda lab: 7,
])
def test_the_usual_mistakes_are_one_line_each(bad, guarded):
    lab = get_lab("baseline")
    with pytest.raises(ConfigError) as err:
        run_lab("baseline", bad(lab), "sim")
    assert "\n" not in str(err.value) and guarded == []


def test_a_mapping_runs_as_its_dataclass_would(guarded):
    with pytest.raises(Reached):
        run_lab("baseline", {"seed": 3, "quick": "true"}, "sim")
    assert guarded[-1] == get_lab("baseline").params(seed=3, quick=True)
