"""Every file a command writes (``labs run --out/--html``, ``replay``, ``doctor``, ``bench``) is
checked before the run and written atomically beside its target: a hostile destination is one
``error:`` line and exit 2 before anything runs (nothing on stdout: the report was never made), a
full disk leaves nothing partial, a planted symlink is replaced and its target untouched; stdout
closed or on a full device ends quietly with a non-zero exit. Real files, a real FIFO, real
tmpfs mounts (full, read-only) in a private mount namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import outfiles
from workbench.errors import ConfigError

ROOT = Path(__file__).parents[2]
LAB = ["labs", "run", "05", "--quick"]  # prefix-bound: a second, a 26 KB record


def trace(tmp: Path) -> Path:
    t = tmp / "t.jsonl"
    t.write_text('{"op": "pool", "pool": "p1"}\n{"op": "alloc", "pool": "p1", "n": 3}\n')
    return t


def commands(tmp: Path) -> dict[str, list[str]]:
    """Each writing command, ready for ``--out PATH`` after it."""
    return {"labs": LAB, "replay": ["replay", str(trace(tmp))], "doctor": ["doctor"],
            "bench": ["bench", "alloc", "--sizes", "1", "--seconds", "0.01", "--repeats", "1"]}


def cli(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=300, cwd=ROOT)


def refused_before_the_run(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""  # no report, no table: nothing ran
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def hostile(tmp: Path, case: str) -> Path:
    """A destination of kind ``case``, made for real."""
    if case == "parent is a file":
        (tmp / "f").write_text("x")
        return tmp / "f" / "rec.json"
    if case == "a folder":
        (tmp / "d").mkdir()
        return tmp / "d"
    if case == "a FIFO":
        os.mkfifo(tmp / "fifo")
        return tmp / "fifo"
    if case == "no name":
        return tmp / ".."
    if case == "a name too long":
        return tmp / ("x" * 300)
    raise AssertionError(case)


CASES = {"parent is a file": "not a folder", "a folder": "is a folder",
         "a FIFO": "is a FIFO", "no name": "not a file name", "a name too long": "not a file name"}


@pytest.mark.parametrize("command", ["labs", "replay", "doctor", "bench"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_destination_is_refused_before_the_run(tmp_path, command, case):
    args = commands(tmp_path)[command]
    dest = hostile(tmp_path, case)
    before = sorted(os.listdir(tmp_path))
    r = cli(*args, "--out", str(dest))
    refused_before_the_run(r, "--out", CASES[case])
    assert sorted(os.listdir(tmp_path)) == before


def test_out_x_md_would_replace_the_record_with_the_report_and_is_refused(tmp_path):
    refused_before_the_run(cli(*LAB, "--out", str(tmp_path / "x.md")), "is also where")
    assert os.listdir(tmp_path) == []


def test_a_planted_symlink_beside_the_record_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "unrelated.txt"
    victim.write_text("keep me")
    (tmp_path / "rec.md").symlink_to(victim)
    (tmp_path / "rec.json").symlink_to(victim)
    r = cli(*LAB, "--out", str(tmp_path / "rec.json"))
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "keep me"
    for name in ("rec.json", "rec.md"):
        assert not (tmp_path / name).is_symlink()
    assert json.loads((tmp_path / "rec.json").read_text())["experiment_id"]
    assert sorted(os.listdir(tmp_path)) == ["rec.json", "rec.md", "unrelated.txt"]


def test_out_and_html_in_one_folder_and_missing_folders_are_made(tmp_path):
    d = tmp_path / "a" / "b"
    r = cli(*LAB, "--out", str(d / "prefix-bound.json"), "--html", str(d))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(d)) == ["index.html", "prefix-bound.json", "prefix-bound.md"]


def test_out_onto_the_html_page_is_refused_before_the_run(tmp_path):
    refused_before_the_run(cli(*LAB, "--out", str(tmp_path / "index.html"), "--html",
                               str(tmp_path)), "--html", "is also where --out")
    assert os.listdir(tmp_path) == []


def test_html_onto_a_file_is_refused_before_the_run(tmp_path):
    (tmp_path / "f").write_text("x")
    refused_before_the_run(cli(*LAB, "--html", str(tmp_path / "f")), "--html", "not a folder")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder without write "
                                              "permission; the read-only mount test covers it")
def test_a_folder_without_write_permission_is_refused_before_the_run(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        refused_before_the_run(cli(*LAB, "--out", str(d / "rec.json")), "takes no new file")
    finally:
        d.chmod(0o700)


# -- real mounts, in a mount namespace of the test's own ----------------------------------------


def _namespace_ok() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    with tempfile.TemporaryDirectory() as d:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs tmpfs '{d}'"],
                               capture_output=True, timeout=30)
    return None if probe.returncode == 0 else "no private mount namespace (unshare -rm) here"


NO_NS = _namespace_ok()
needs_ns = pytest.mark.skipif(NO_NS is not None, reason=str(NO_NS))


def in_mount(tmp: Path, setup: str, args: list[str]) -> tuple[int, str, list[str]]:
    """Mount a tmpfs on ``tmp/m`` (in a private namespace), run ``setup`` there, then the
    command; returns (exit status, stderr, what the mount holds afterwards)."""
    m = tmp / "m"
    m.mkdir()
    script = (f'mount -t tmpfs -o size=256k tmpfs "$M" && cd "$M" && {setup} && cd / && '
              f'"$PY" -m workbench "$@" >/dev/null 2>"$ERR"; echo "$?"; ls -A "$M"')
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", *args], capture_output=True,
                       text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "M": str(m), "PY": sys.executable,
                            "ERR": str(tmp / "err")})
    assert r.returncode == 0, r.stderr
    rc, *left = r.stdout.split("\n")
    return int(rc), (tmp / "err").read_text(), sorted(x for x in left if x)


FILL = "head -c 245760 /dev/zero > filler"  # 240 KiB of 256: the check passes, the write fails


@needs_ns
@pytest.mark.parametrize("command", ["labs", "replay"])
def test_a_disk_that_fills_during_the_write_leaves_nothing_partial(tmp_path, command):
    if command == "replay":  # a result (180 KB) larger than what is left
        t = tmp_path / "big.jsonl"
        t.write_text('{"op": "pool", "pool": "p1"}\n' +
                     '{"op": "alloc", "pool": "p1", "n": 1}\n' * 3000)
        args = ["replay", str(t)]
    else:
        args = LAB
    rc, err, left = in_mount(tmp_path, FILL, [*args, "--out", str(tmp_path / "m" / "rec.json")])
    assert rc == 2, err
    assert len([ln for ln in err.splitlines() if ln.startswith("error: ")]) == 1, err
    assert "ENOSPC" in err and "nothing was left behind" in err and "Traceback" not in err
    assert left == ["filler"]  # no record, no report, no temporary file


@needs_ns
@pytest.mark.parametrize("command", ["labs", "replay", "doctor", "bench"])
def test_a_full_disk_is_refused_before_the_run(tmp_path, command):
    rc, err, left = in_mount(tmp_path, "{ head -c 300000 /dev/zero > filler || true; }",
                             [*commands(tmp_path)[command], "--out",
                              str(tmp_path / "m" / "rec.json")])
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "no space left" in err
    assert left == ["filler"]


@needs_ns
@pytest.mark.parametrize("command", ["labs", "replay", "doctor", "bench"])
def test_a_read_only_mount_is_refused_before_the_run(tmp_path, command):
    rc, err, left = in_mount(tmp_path, 'mkdir sub && mount -o remount,ro "$M"',
                             [*commands(tmp_path)[command], "--out",
                              str(tmp_path / "m" / "sub" / "rec.json")])
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "EROFS" in err and "takes no new file" in err
    assert left == ["sub"]


# -- stdout --------------------------------------------------------------------------------------


STDOUT_USERS = [["labs", "list"], ["kvctl", "list", "--json"], ["doctor", "--json"],
                ["kvctl", "budget"]]


@pytest.mark.parametrize("args", STDOUT_USERS, ids=lambda a: " ".join(a))
def test_stdout_on_a_full_device_ends_quietly_non_zero(args):
    with open("/dev/full", "w") as full:
        r = cli(*args, stdout=full)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "error: stdout: No space left on device"


@pytest.mark.parametrize("args", STDOUT_USERS, ids=lambda a: " ".join(a))
def test_stdout_closed_ends_quietly_non_zero(args):
    r = subprocess.run([sys.executable, "-m", "workbench", *args], stderr=subprocess.PIPE,
                       text=True, timeout=300, cwd=ROOT, close_fds=True,
                       preexec_fn=lambda: os.close(1))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "error: stdout: stdout is closed"


def test_a_closed_pipe_is_quiet():
    p = subprocess.Popen([sys.executable, "-m", "workbench", "labs", "list"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    p.stdout.close()  # the reader went away before the first line
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1 and err == ""


# -- the module, over a space of names and contents -----------------------------------------------


names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"),
                min_size=1, max_size=80)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names, data=st.binary(max_size=4096))
def test_any_name_is_written_whole_or_refused_in_one_line(tmp_path, name, data):
    target = tmp_path / name
    try:
        outfiles.check(target)
    except ConfigError as err:
        assert "\n" not in str(err) and str(err).count("Fix:") == 1
        return
    assert outfiles.write_all([(target, data)]) == [target]
    assert target.read_bytes() == data
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".part")]
    if target.is_file():
        target.unlink()


def test_a_failure_midway_writes_none_of_the_files(tmp_path):
    good = tmp_path / "a.json"
    good.write_text("old")
    with pytest.raises(ConfigError, match="could not be written"):
        outfiles.write_all([(good, "new"), (tmp_path / "a.json" / "under-a-file", "x")])
    assert good.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["a.json"]
