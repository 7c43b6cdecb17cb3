"""Names from outside reach the terminal as text: never as rich markup, control characters
escaped (:mod:`workbench.terminal`) -- a trace's pool names in ``replay``, budget-file names in
``kvctl``/``kvtop``, an unknown ``WORKBENCH_KV_*`` name in every command's refusal, ``doctor``'s
echo of values."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from workbench.core import budget_segment as bs
from workbench.terminal import as_text, plain

ROOT = Path(__file__).parents[2]
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # \t, \n allowed
HOSTILE = ["a[/red]b", "[bold red]x[/]", "\x1b[31mred", "\x1b]0;title\x07", "x\rover",
           "\x9b2J", "\u202egnp.exe", "[link=file:///etc]y[/link]"]


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env={**os.environ, **(env or {})})


@given(st.text())
def test_plain_leaves_no_control_character_and_keeps_the_rest(s):
    out = plain(s)
    assert not RAW.search(out) and "\n" not in out and "\t" not in out
    if not re.search("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]", s):
        assert out == s


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=30) |
       st.sampled_from(HOSTILE))
def test_a_rich_cell_shows_the_name_as_written(s):
    con = Console(record=True, width=400, force_terminal=True, color_system="truecolor")
    con.print(as_text(s), end="", soft_wrap=True)
    assert con.export_text() == plain(s)


def test_replay_prints_markup_looking_pool_names_as_text(tmp_path):
    t = tmp_path / "t.jsonl"
    names = ["a[/red]b", "[bold]x", "[link=http://e]y[/link]"]
    t.write_text("".join(f'{{"op": "pool", "pool": "{n}"}}\n{{"op": "alloc", "pool": "{n}", '
                         f'"n": 2}}\n' for n in names))
    r = cli("replay", str(t), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    for n in names:
        assert n in r.stdout


@pytest.fixture
def shm(tmp_path):
    d = tmp_path / "shm"
    d.mkdir()
    return d


def plant_budgets(shm: Path) -> list[str]:
    """Copies of a real budget file under hostile names."""
    b = bs.SharedBudget.open("good", 1 << 20, shm_dir=shm)
    b.close()
    src = bs.budget_path("good", shm)
    planted = []
    for n in HOSTILE:
        name = bs.PREFIX + n.replace("/", "_")
        shutil.copyfile(src, shm / name)
        planted.append(name[len(bs.PREFIX):])
    return planted


@pytest.mark.parametrize("args", [["kvctl", "budget"], ["kvctl", "list"], ["kvtop", "--once"],
                                  ["kvctl", "gc"], ["kvctl", "budget", "--gc"]],
                         ids=" ".join)
def test_budget_file_names_are_shown_escaped_and_never_styled(shm, args):
    planted = plant_budgets(shm)
    r = cli(*args, env={"WORKBENCH_KV_SHM_DIR": str(shm), "COLUMNS": "300"})
    assert r.returncode == 0, r.stderr
    both = r.stdout + r.stderr
    assert not RAW.search(both), repr(both)
    if args[-1] in ("budget", "list", "--once"):
        for n in planted:
            assert plain(n) in both


@pytest.mark.parametrize("args", [["kvctl", "list"], ["labs", "list"], ["replay", "x.jsonl"],
                                  ["kvtop", "--once"], ["bench", "alloc"], ["serve"]],
                         ids=" ".join)
@pytest.mark.parametrize("name", HOSTILE[2:4])
def test_an_unknown_setting_is_refused_with_its_name_escaped(args, name):
    var = "WORKBENCH_KV_" + name.replace("\x00", "")
    r = cli(*args, env={var: "1"})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a workbench setting" in lines[0], r.stderr
    assert not RAW.search(r.stderr) and plain(var) in lines[0]


@pytest.mark.parametrize("value", HOSTILE[:4:3] + HOSTILE[4:5])
def test_doctor_echoes_values_inert(value):
    r = cli("doctor", env={"WORKBENCH_KV_MEMORY_LIMIT": value, "COLUMNS": "300"})
    assert not RAW.search(r.stdout + r.stderr), repr(r.stdout)
    assert f"WORKBENCH_KV_MEMORY_LIMIT={plain(value)}" in r.stdout
