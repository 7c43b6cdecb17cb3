"""A parameter a backend does not read is still checked there: a wrong value is one ConfigError
line on every backend, before anything runs (not ignored on one, refused on another)."""

from __future__ import annotations

import pytest

from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab


@pytest.mark.parametrize(("lab", "values", "what"), [
    ("pd-split", {"gpus": 3}, "gpus=3: the real handover runs one prefill engine"),
    ("pd-split", {"gpus": 0}, "gpus=0: the real handover runs one prefill engine"),
    ("tiered-retrieval", {"costs": "nope"}, "tier cost preset 'nope': is not defined"),
    ("colocation", {"repeats": 0}, "repeats=0, first_repeat=0: a sweep runs 1 to 100 repeats"),
    ("colocation", {"first_repeat": -1}, "repeats=1, first_repeat=-1: a sweep runs"),
])
@pytest.mark.parametrize("backend", ["sim", "host"])
def test_a_bad_value_is_refused_on_every_backend(lab, values, what, backend):
    params = get_lab(lab).params(quick=True, **values)
    with pytest.raises(ConfigError) as err:
        run_lab(lab, params, backend)
    assert str(err.value).startswith(what) and "\n" not in str(err.value)
