"""``kvctl budget`` / ``kvctl list`` / ``kvctl gc`` over a real budget file, in a private shm
folder: who holds what, a dead holder reclaimed by gc, a corrupt file named in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workbench.core import budget_segment as bs

MiB = 1 << 20


def cli(shm, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORKBENCH_KV_SHM_DIR": str(shm), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.fixture
def shm(tmp_path):
    d = tmp_path / "shm"
    d.mkdir()
    return d


def test_budget_shows_holders_and_gc_reclaims_the_dead(shm):
    mine = bs.SharedBudget.open("cuda-0", 64 * MiB, shm_dir=shm)
    assert mine.charge(8 * MiB)
    dead = bs.SharedBudget.open("cuda-0", None, shm_dir=shm)
    dead.me = (os.getpid(), mine.me[1] + 1)  # this pid, another start time: a reused pid
    assert dead.charge(4 * MiB)
    r = cli(shm, "kvctl", "budget", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["cuda-0"]
    assert (got["total"], got["held"], got["free"]) == (64 * MiB, 12 * MiB, 52 * MiB)
    assert sorted((h["alive"], h["held"]) for h in got["holders"]) == [(False, 4 * MiB),
                                                                       (True, 8 * MiB)]
    r = cli(shm, "kvctl", "list")
    assert "cuda-0" in r.stdout and "NO (reclaimable)" in r.stdout
    r = cli(shm, "kvctl", "gc", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["budget_reclaimed"] == {"cuda-0": 4 * MiB}
    assert mine.state().held == 8 * MiB
    r = cli(shm, "kvctl", "budget", "--delete", "cuda-0")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "holds" in r.stderr
    mine.credit(8 * MiB)
    assert cli(shm, "kvctl", "budget", "--delete", "cuda-0").returncode == 0
    assert not bs.budget_path("cuda-0", shm).exists()
    mine.close()
    dead.close()


def test_a_corrupt_budget_is_named_in_one_line_and_kept(shm):
    path = bs.budget_path("cuda-1", shm)
    path.write_bytes(b"\x00" * 100)
    for args in (("kvctl", "budget"), ("kvctl", "list"), ("kvctl", "gc", "-v"),
                 ("kvtop", "--once")):
        r = cli(shm, *args)
        assert r.returncode == 0 and "Traceback" not in r.stderr, args
        lines = (r.stderr + r.stdout).splitlines()  # kvtop draws it in its frame
        assert [line for line in lines if str(path) in line] == \
            [f"skipped {path}: no budget magic: not a workbench budget"], args
    assert path.read_bytes() == b"\x00" * 100
    r = cli(shm, "kvctl", "budget", "--delete", "cuda-1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert path.exists()


def test_no_budget_changes_nothing_in_list(shm):
    r = cli(shm, "kvctl", "list")
    assert r.stdout.strip() == "no pools" and r.stderr == ""
    assert cli(shm, "kvctl", "budget").stdout.strip() == "no gpu budgets"
