"""The colocation lab's ``out_dir`` (where a sweep writes ``repeat_<r>.json`` as it goes) is
checked before anything runs, as every output is (:mod:`workbench.outfiles`): a bad destination
is one ConfigError line and no runner is entered; a good one is left untouched by the check."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab
from workbench.labs.colocation.lab import ColocationLab


@pytest.fixture
def never_run(monkeypatch):
    """Entering any of the lab's runners fails the test: the refusal must come first."""
    def boom(*a, **kw):
        raise AssertionError("the colocation lab ran with a refused out_dir")

    monkeypatch.setattr(ColocationLab, "runners", {f: boom for f in ColocationLab.runners})


def _refused(out_dir: str, backend: str = "host", **params) -> str:
    lab = get_lab("colocation")
    with pytest.raises(ConfigError) as err:
        run_lab("colocation", lab.params(out_dir=out_dir, **params), backend)
    text = str(err.value)
    assert "\n" not in text and text.startswith("out_dir ") and "Fix:" in text, text
    return text


@pytest.mark.parametrize("backend", ["host", "gpu", "sim"])
def test_an_out_dir_that_is_a_file_is_refused_before_the_run(never_run, tmp_path, backend):
    f = tmp_path / "reps"
    f.write_text("")
    if backend == "gpu":  # the gpu backend's own refusal comes first where no GPU is usable
        try:
            get_lab("colocation").check_backend("gpu")
        except ConfigError:
            pytest.skip("no usable GPU here")
    assert "is a file, not a folder" in _refused(str(f), backend)


def test_an_out_dir_below_a_file_is_refused(never_run, tmp_path):
    (tmp_path / "f").write_text("")
    assert f"{tmp_path / 'f'} is a file, not a folder" in _refused(str(tmp_path / "f" / "reps"))


def test_a_repeat_file_that_is_a_folder_is_refused(never_run, tmp_path):
    (tmp_path / "reps" / "repeat_2.json").mkdir(parents=True)
    text = _refused(str(tmp_path / "reps"), repeats=2, first_repeat=1)
    assert "repeat_2.json: is a folder, not a file" in text
    # repeats 0 and 1 write other names: that folder is no obstacle to them
    run = get_lab("colocation").check_backend(
        "host", get_lab("colocation").params(out_dir=str(tmp_path / "reps"), repeats=2))
    assert run.family == "mini"


@pytest.mark.skipif(os.geteuid() == 0, reason="root creates files in a read-only folder")
def test_a_read_only_out_dir_is_refused(never_run, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert "takes no new file" in _refused(str(ro / "reps"))
    finally:
        ro.chmod(0o700)


def test_a_good_out_dir_passes_and_the_check_leaves_nothing(tmp_path):
    lab = get_lab("colocation")
    run = lab.check_backend("host", lab.params(out_dir=str(tmp_path / "new" / "reps")))
    assert run.family == "mini"
    assert list(tmp_path.iterdir()) == []  # no folder made, no probe file left


def test_reading_saved_repeats_back_writes_no_out_dir(tmp_path):
    """With ``from_dir`` nothing is written, so ``out_dir`` is not a destination then."""
    f = tmp_path / "reps"
    f.write_text("")
    lab = get_lab("colocation")
    params = lab.params(out_dir=str(f), from_dir=str(tmp_path))
    assert lab.check_backend("host", params).family == "mini"


def test_the_command_line_refuses_a_bad_out_dir_in_one_line(never_run, tmp_path):
    f = tmp_path / "reps"
    f.write_text("")
    r = CliRunner().invoke(app, ["labs", "run", "colocation", "--backend", "host",
                                 "--param", f"out_dir={f}"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if "out_dir" in ln]
    assert len(lines) == 1 and "is a file, not a folder" in lines[0], r.output
