"""The files the ``python -m workbench.bench.*`` tools, the quiz sealer and the real engines'
model folders write go through ``outfiles`` as the commands' do: a hostile destination is one
``error:`` line and exit 2 before the tool runs (real files, real folders, a read-only mount); a
planted symlink is replaced, never written through; a log written as the run goes is opened
without following a link. The destinations and their words are ``test_outputs``'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hostile.test_outputs import CASES, ROOT, hostile, needs_ns, refused_before_the_run
from workbench import outfiles
from workbench.errors import ConfigError

# each tool, with its output flag last (a file, or a folder for the tools that write several)
TOOLS = {
    "difftrace": (["7"], None, "file"),
    "vmm_probe": ([], None, "file"),
    "vmm_bw_probe": ([], "--out", "file"),
    "calibrate": (["--bench", os.devnull], "--out", "file"),
    "vllm_limit": (["--steps"], "--out", "folder"),
    "vllm_speed": ([], "--out", "folder"),
    "mini": (["--device", "cpu"], "--out", "folder"),
    "ab": (["--device", "cpu"], "--out", "folder"),
}


def tool(name: str, dest: Path) -> subprocess.CompletedProcess:
    args, flag, _ = TOOLS[name]
    cmd = [sys.executable, "-m", f"workbench.bench.{name}", *args,
           *([flag] if flag else []), str(dest)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.parametrize("name", list(TOOLS))
def test_each_tool_refuses_a_file_as_the_parent_before_it_runs(tmp_path, name):
    refused_before_the_run(tool(name, hostile(tmp_path, "parent is a file")),
                           CASES["parent is a file"])


@pytest.mark.parametrize("case", ["a FIFO", "a name too long", "a folder"])
def test_a_tool_writing_one_file_refuses_every_hostile_destination(tmp_path, case):
    refused_before_the_run(tool("vmm_bw_probe", hostile(tmp_path, case)), CASES[case])


def test_a_tool_writing_a_folder_refuses_a_file_in_its_place(tmp_path):
    (tmp_path / "out").write_text("x")
    refused_before_the_run(tool("vllm_speed", tmp_path / "out"), "is a file, not a folder")


def test_a_tool_writing_a_folder_refuses_a_folder_where_one_of_its_files_goes(tmp_path):
    (tmp_path / "out" / "vllm_speed.md").mkdir(parents=True)
    refused_before_the_run(tool("vllm_speed", tmp_path / "out"), "vllm_speed.md", "is a folder")


@needs_ns
def test_a_read_only_mount_is_refused_before_the_tool_runs(tmp_path):
    m = tmp_path / "m"
    m.mkdir()
    script = ('mount -t tmpfs -o size=256k tmpfs "$M" && mount -o remount,ro "$M" && '
              '"$PY" -m workbench.bench.difftrace 7 "$M/t.jsonl"')
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env={**os.environ, "M": str(m),
                                                   "PY": sys.executable})
    refused_before_the_run(r, "takes no new file")


def test_a_tool_writes_its_record_atomically_over_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "t.jsonl").symlink_to(victim)
    r = tool("difftrace", tmp_path / "t.jsonl")
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "keep" and not (tmp_path / "t.jsonl").is_symlink()
    ops = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert ops and all("op" in op for op in ops)
    assert sorted(os.listdir(tmp_path)) == ["t.jsonl", "victim"]  # no partial file left


def test_a_model_folders_config_replaces_a_planted_symlink(tmp_path):
    from workbench.engines.real import shapes

    victim = tmp_path / "victim.json"
    victim.write_text("keep")
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").symlink_to(victim)
    shapes.write(out, tmp_path / "no-tokenizer", "llama-3.1-8b")
    assert victim.read_text() == "keep" and not (out / "config.json").is_symlink()
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"


def test_a_model_folder_under_a_file_is_one_line(tmp_path):
    from workbench.engines.real import shapes

    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError) as err:
        shapes.write(tmp_path / "f" / "model", tmp_path / "no-tokenizer", "llama-3.1-8b")
    assert "\n" not in str(err.value)


def quiz(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench.quiz", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_the_quiz_sealer_refuses_before_it_seals(tmp_path):
    opened = quiz("open", str(ROOT / "workbench" / "quiz" / "data" / "00_start_here.json"))
    assert opened.returncode == 0, opened.stderr
    (tmp_path / "open.json").write_text(opened.stdout)
    (tmp_path / "f").write_text("x")
    r = quiz("close", str(tmp_path / "open.json"), str(tmp_path / "f" / "sealed.json"))
    refused_before_the_run(r, "SEALED", "is a file, not a folder")


# -- the stream and the main, over a space of values --------------------------------------------


names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"),
                min_size=1, max_size=80)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names, kind=st.sampled_from(["none", "file", "link", "folder", "fifo"]),
       text=st.text(max_size=200))
def test_a_stream_is_a_regular_file_or_one_line(tmp_path, name, kind, text):
    target = tmp_path / name
    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_text("keep")
    try:
        made = {"file": lambda: target.write_text("old"), "link": lambda: target.symlink_to(victim),
                "folder": target.mkdir, "fifo": lambda: os.mkfifo(target), "none": lambda: None}
        try:
            made[kind]()
        except OSError:  # a name the file system takes for no entry (too long): no case
            return
        try:
            with outfiles.open_stream(target) as f:
                f.write(text)
        except ConfigError as err:
            assert kind in ("link", "folder", "fifo") and "\n" not in str(err), err
            assert str(err).count("Fix:") == 1
        else:
            assert kind in ("none", "file") and target.read_bytes() == text.encode()
        assert victim.read_text() == "keep"
    finally:
        victim.unlink()
        for entry in tmp_path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                entry.rmdir()
            else:
                entry.unlink()


MAIN = """
from workbench.errors import ConfigError
from workbench.outfiles import run_main

def main(argv):
    print("before")
    raise ConfigError("--out x", "is \\x1b[31mred\\x1b[0m\\nand long", "give another")

raise SystemExit(run_main(main, []))
"""


def test_a_main_that_refuses_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "-c", MAIN], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 2 and r.stdout == "before\n"
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: --out x: is "), r.stderr
    assert "\x1b" not in r.stderr
