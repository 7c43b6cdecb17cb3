"""Every ``workbench`` command reads the settings once, before it runs: a bad or misspelt
``WORKBENCH_KV_*`` is one ``error:`` line and exit 2 for each of them (the list of commands is the
CLI's own, so a new command is covered). ``kvctl limit`` never rounds a limit in silence, and a
shm folder that is not there is one line, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from workbench.cli import SETTINGS_OWN, app
from workbench.config import PoolConfig
from workbench.core import control, limit_requests
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError, ControlError
from workbench.settings import settings as read_settings
from workbench.sim.device import SimDevice
from workbench.units import MiB

ROOT = Path(__file__).resolve().parents[2]
P = "WORKBENCH_KV_"
BAD = [{P + "MEMORY_LIMIT": "garbage"}, {P + "MEMORY_LIMT": "1G"}, {P + "MEMORY_LIMIT": "0"},
       {P + "SOCKET_DIR": "relative/dir"}, {P + "SHM_DIR": "/no/such/dir"},
       {P + "MIN_RESERVED_PAGES": "٣"}, {P + "GPU_UTILIZATION": "5e-324"},
       {P + "PAGE_SIZE": "３MiB"}]
ARGS = {("replay",): [str(ROOT / "examples" / "three_instances.jsonl")],
        ("serve",): ["--port", "0"], ("kvctl", "limit"): ["llama_a", "8M"],
        ("kvctl", "limit-percent"): ["llama_a", "50"], ("kvctl", "delete"): ["llama_a"],
        ("labs", "run"): ["colocation"], ("kvctl", "watch"): ["--count", "1"]}


def _commands(cmd=None, path=()):
    cmd = typer.main.get_command(app) if cmd is None else cmd
    if not hasattr(cmd, "list_commands"):
        yield path
        return
    for name in cmd.list_commands(None):
        yield from _commands(cmd.get_command(None, name), (*path, name))


COMMANDS = [c for c in _commands() if c[0] not in SETTINGS_OWN]
CASES = [(c, BAD[i % len(BAD)]) for i, c in enumerate(COMMANDS)]
CASES += [(c, bad) for c in (("serve",), ("replay",), ("kvctl", "gc")) for bad in BAD]


def _run(argv, bad: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(P)} | bad
    return subprocess.run([sys.executable, "-m", "workbench", *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _expected(bad: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as err:
        read_settings(bad)
    return f"error: {err.value}"


def test_every_command_is_listed():
    assert {("serve",), ("replay",), ("kvctl", "gc"), ("labs", "run")} <= set(COMMANDS)


@pytest.mark.parametrize("argv, bad", CASES, ids=[f"{' '.join(c)}-{next(iter(b))[len(P):]}"
                                                  for c, b in CASES])
def test_a_bad_setting_stops_every_command_in_one_line(argv, bad):
    r = _run([*argv, *ARGS.get(argv, [])], bad)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.splitlines() == [_expected(bad)]


def test_help_still_shows_under_a_bad_setting():
    r = _run(["kvctl", "limit", "--help"], BAD[1])
    assert r.returncode == 0 and "Usage:" in r.stdout


def test_doctor_reports_a_misspelt_name_and_check_fails_on_it():
    plain, check = _run(["doctor"], BAD[1]), _run(["doctor", "--check"], BAD[1])
    assert (plain.returncode, check.returncode) == (0, 1)
    assert "UNKNOWN SETTING: WORKBENCH_KV_MEMORY_LIMT" in check.stdout
    assert "Traceback" not in plain.stderr + check.stderr


@pytest.fixture
def owned():
    """A pool of this process with a control segment: 8 MiB page ids, 32 page ids."""
    name = f"knobs_{os.getpid()}"
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=2048)
    kv = KVCacheManager(geo, SimDevice(), name=name, config=PoolConfig(ipc_name=name))
    yield name, kv
    kv.close()


def test_a_limit_off_the_page_ids_is_refused_saying_what_it_would_be(owned):
    name, kv = owned
    before = control.read_segment(name)
    with pytest.raises(ControlError) as err:
        limit_requests.request_limit(name, 12 * MiB, wait_s=0)
    assert str(err.value) == ("limit 12MiB is not a whole number of page ids (8MiB "
                              "each): the pool would keep 8MiB. Fix: ask for 8MiB or 16MiB")
    r = _run(["kvctl", "limit", name, "3MiB"], {})
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "error: limit 3MiB is below one page id (8MiB); the null block lives on page 0. "
        "Fix: ask for at least 8MiB"]
    r = _run(["kvctl", "limit", name, "20MiB"], {})
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "error: limit 20MiB is not a whole number of page ids (8MiB each): the pool "
        "would keep 16MiB. Fix: ask for 16MiB or 24MiB"]
    after = control.read_segment(name)
    assert (after.req_revision, after.req_limit) == (before.req_revision, before.req_limit)


def test_limit_percent_asks_for_whole_page_ids_and_says_how_many_bytes(owned):
    name, kv = owned
    r = _run(["kvctl", "limit-percent", name, "30", "--json", "--wait", "0"], {})
    assert r.returncode == 0, r.stderr
    asked = json.loads(r.stdout)["pool"], json.loads(r.stdout)["requested"]
    page_id = kv.geometry.page_id_bytes
    assert asked == (name, kv.capacity_bytes * 30 // 100 // page_id * page_id)
    assert control.read_segment(name).req_limit == asked[1]


def test_a_shm_folder_that_is_gone_is_one_line(monkeypatch, tmp_path):
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=256)
    (tmp_path / "a_file").write_text("")
    for where in (tmp_path / "gone", tmp_path / "a_file"):
        monkeypatch.setattr(control, "SHM_DIR", where)
        with pytest.raises(ConfigError) as err:
            KVCacheManager(geo, SimDevice(), name="p", config=PoolConfig(ipc_name="p"))
        assert str(err.value).startswith(f"IPC name 'p': the shm folder {where} takes no "
                                         "segment (")
        assert str(err.value).endswith("Fix: set WORKBENCH_KV_SHM_DIR to an existing directory "
                                       "you can write, or unset it for /dev/shm")


def test_gc_with_a_socket_folder_it_cannot_trust_fails_instead_of_leaving_it_alone(tmp_path):
    base = tmp_path / "shared"
    base.mkdir(mode=0o777)
    base.chmod(0o777)  # others could plant sockets here: not the workbench's to collect
    r = _run(["kvctl", "gc"], {P + "SOCKET_DIR": str(base)})
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: socket directory {base}: is not a private directory owned by you (mode 0700). "
        "Fix: remove it, or set WORKBENCH_KV_SOCKET_DIR to a fresh path"]
