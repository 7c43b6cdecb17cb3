"""One set of conventions over every command: ``--json`` prints JSON on stdout and takes no
value, ``--out PATH`` writes the record, errors are one ``error:`` line whose fix is written as
options, tables keep full values when piped, labs are numbered as their notebooks, and a command
that needs torch says so in one line when it is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.cli.common import cli_syntax
from workbench.cli.labs import lab_name
from workbench.labs import LABS

from .commands import leaves, option

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "examples" / "three_instances.jsonl"


def test_json_is_a_flag_and_out_a_path_everywhere():
    with_json = with_out = 0
    for path, cmd in leaves():
        j, o = option(cmd, "--json"), option(cmd, "--out")
        if j is not None:
            with_json += 1
            assert j.is_flag, (path, "--json takes no value")
        if o is not None:
            with_out += 1
            assert not o.is_flag and o.type_descriptor.annotation is Path, path
            assert j is not None, (path, "a command that writes a record also prints it")
    assert with_json >= 14 and with_out >= 8


# commands quick enough to run here, each with --json and --out
RUNS = {
    "bench alloc": ["bench", "alloc", "--sizes", "1", "--seconds", "0.01", "--repeats", "1"],
    "replay": ["replay", str(TRACE), "--no-events"],
    "labs run 06": ["labs", "run", "06", "--quick"],
    "doctor": ["doctor"],
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_json_on_stdout_equals_the_record_written(name, tmp_path):
    out = tmp_path / "rec.json"
    res = CliRunner().invoke(app, [*RUNS[name], "--json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)  # one JSON document, nothing else on stdout
    written = json.loads(out.read_text())
    if name == "labs run 06":  # the written record names where it was written
        written["raw_data"].pop("record", None)
        printed["raw_data"].pop("record", None)
    assert printed == written
    assert f"wrote {out}" in res.stderr


@pytest.mark.parametrize("argv", [["labs", "list", "--json"], ["kvctl", "list", "--json"],
                                  ["kvtop", "--json"]])
def test_json_only_commands_print_one_document(argv):
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert isinstance(json.loads(res.stdout), list)


def test_labs_are_numbered_as_their_notebooks():
    notebooks = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
    assert len(notebooks) == len(LABS)
    for nb in notebooks:
        number, _, stem = nb.stem.partition("_")
        assert lab_name(number) == stem.replace("_", "-"), nb.name
    res = CliRunner().invoke(app, ["labs", "list"])
    lines = res.stdout.splitlines()
    assert [ln[:2] for ln in lines] == [f"{i:02d}" for i in range(len(LABS))]
    wide = max(map(len, LABS))
    for ln, name in zip(lines, LABS, strict=True):  # name, then backends in one column
        assert ln[4:4 + wide].rstrip() == name and ln[4 + wide:6 + wide] == "  " \
            and ln[6 + wide] != " ", ln


def test_labs_run_by_number_and_html(tmp_path):
    res = CliRunner().invoke(app, ["labs", "run", "06", "--quick", "--html", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("# KV capacity")  # Markdown itself when piped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html"]  # one page
    page = (tmp_path / "index.html").read_text()
    assert "<h1>KV capacity" in page and page.count("class='wb-figure'") >= 1


def test_a_fix_is_written_as_options():
    assert cli_syntax("Fix: use backend='sim'") == "Fix: use --backend sim"
    assert cli_syntax('pass kv_memory="1GiB"') == "pass --kv-memory 1GiB"
    res = CliRunner().invoke(app, ["labs", "run", "99"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: lab 99") and "Fix:" in res.stderr


def test_tables_keep_full_values_when_piped():
    res = CliRunner().invoke(app, ["replay", str(TRACE)], terminal_width=60)
    assert res.exit_code == 0, res.output
    assert "…" not in res.stdout
    assert "176.00 MiB" in res.stdout and "quarantined" in res.stdout


NO_TORCH = ("import sys; sys.modules['torch'] = None; from workbench.cli import main; "
            "sys.argv = ['workbench', *sys.argv[1:]]; main()")


@pytest.mark.parametrize("argv", [
    ["serve", "--device", "cpu"],
    ["bench", "crossover", "--backend", "host"],
    ["labs", "run", "tiered-retrieval", "--backend", "host", "--quick"],
])
def test_torch_missing_is_one_line(argv):
    r = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: `workbench "), r.stderr
    assert "needs torch" in r.stderr and "pip install 'kv-cache-workbench[torch]'" in r.stderr
