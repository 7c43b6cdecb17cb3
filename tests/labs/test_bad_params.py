"""A parameter a backend does not read is still checked there: a wrong value is one ConfigError
line on every backend, before anything runs (not ignored on one, refused on another)."""

from __future__ import annotations

import pytest

from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab


@pytest.mark.parametrize(("lab", "values", "what"), [
    ("pd-split", {"gpus": 3}, "lab 'pd-split' parameter gpus=3: outside 1..2"),
    ("pd-split", {"gpus": 0}, "lab 'pd-split' parameter gpus=0: outside 1..2"),
    ("tiered-retrieval", {"costs": "nope"},
     "lab 'tiered-retrieval' parameter costs=nope: not a known choice"),
    ("colocation", {"repeats": 0}, "lab 'colocation' parameter repeats=0: outside 1..100"),
    ("colocation", {"first_repeat": -1},
     "lab 'colocation' parameter first_repeat=-1: outside 0..99"),
])
@pytest.mark.parametrize("backend", ["sim", "host"])
def test_a_bad_value_is_refused_on_every_backend(lab, values, what, backend):
    with pytest.raises(ConfigError) as err:  # by its declared range, before the run
        run_lab(lab, get_lab(lab).params(quick=True, **values), backend)
    assert str(err.value).startswith(what) and "\n" not in str(err.value)


def _sweep_dir(tmp_path, name: str, content: str | None, link: bool = False):
    d = tmp_path / name
    d.mkdir()
    f = d / "repeat_0.json"
    if link:
        (tmp_path / "target.json").write_text(content or "{}")
        f.symlink_to(tmp_path / "target.json")
    elif content is not None:
        f.write_text(content)
    else:
        (d / "repeat_x.json").write_text("{}")  # a name that is not a repeat's
    return d


SWEEPS = [
    ("notjson", "{not json", False, "is not readable JSON (JSONDecodeError)"),
    ("deep", "[" * 100_000, False, "is not strict JSON: nested deeper than 64 levels"),
    ("list", "[1, 2, 3]", False, "is not a repeat record (no config and runs)"),
    ("fields", '{"config": {"peaks": [1]}, "runs": {}}', False, "cannot read (KeyError"),
    ("types", '{"config": {"peaks": "x", "modes": 5}, "runs": {"1/static": 5}}', False,
     "cannot read ("),
    ("link", "{}", True, "is not a regular file (no link)"),
    ("noname", None, False, "holds no repeat_<r>.json"),
]


@pytest.mark.parametrize(("name", "content", "link", "words"), SWEEPS)
def test_a_hostile_sweep_folder_is_one_line_in_the_lab_and_calibrate(
        tmp_path, capsys, name, content, link, words):
    """Sweep files are read back from disk (from_dir, calibrate --sweep): outside input."""
    from workbench.bench.calibrate import main

    d = _sweep_dir(tmp_path, name, content, link)
    params = get_lab("colocation").params(from_dir=str(d))
    with pytest.raises(ConfigError) as err:
        run_lab("colocation", params, "host")
    assert words in str(err.value) and "\n" not in str(err.value)
    assert main(["--sweep", str(d)]) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: ") and out.err.count("\n") == 1 and "Traceback" not in out.err
