"""Nothing of another program is touched: whatever the flags, ``kvctl delete`` (``--force`` too),
``kvctl gc`` and ``kvctl limit`` remove or write only files they can prove are the workbench's
own (name, this user, a regular file, the segment magic and header), and say in one line why
they leave any other. Contents are drawn by hypothesis; the CLI cases run real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.hostile.test_shm import dead_pid, seg_bytes
from workbench.core import control, segment
from workbench.core.limit_requests import request_limit
from workbench.errors import ControlError

ROOT = Path(__file__).parents[2]

foreign = st.one_of(
    st.binary(max_size=600).filter(lambda b: not b.startswith(segment.MAGIC)),
    st.builds(lambda n, tail: segment.MAGIC[:n] + tail, st.integers(0, 7), st.binary(max_size=300)),
    st.builds(lambda b: bytes(b), st.just(bytearray(seg_bytes(1)))).map(
        lambda b: b"NOTASEG\x00" + b[8:]),  # a whole segment but another program's magic
    st.builds(lambda v, h, tail: segment.MAGIC + v.to_bytes(4, "little") + h.to_bytes(4, "little")
              + tail, st.sampled_from([0, 256, 1 << 31]), st.integers(0, 1 << 32 - 1),
              st.binary(max_size=100)),  # the magic, but no segment header after it
)


def snapshot(path: Path) -> tuple[bytes, int, int]:
    st_ = os.lstat(path)
    return path.read_bytes(), st_.st_ino, st_.st_mtime_ns


@pytest.fixture
def planted():
    paths: list[Path] = []

    def plant(data: bytes, partial: bool = False) -> tuple[str, Path]:
        name = f"ho_{uuid.uuid4().hex[:10]}"
        entry = (f"{segment.PARTIAL_PREFIX}{dead_pid()}_1_abcd_{name}" if partial
                 else segment.PREFIX + name)
        path = segment.SHM_DIR / entry
        path.write_bytes(data)
        paths.append(path)
        return name, path

    yield plant
    for p in paths:
        p.unlink(missing_ok=True)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=foreign, force=st.booleans())
@example(data=b"", force=True)
@example(data=b"hello, I belong to another program\n", force=True)
def test_delete_gc_and_limit_never_touch_a_file_without_the_segment_magic(planted, data, force):
    name, path = planted(data)
    before = snapshot(path)
    with pytest.raises(ControlError) as err:
        control.delete_segment(name, force=force)
    assert "\n" not in str(err.value) and "left alone" in str(err.value)
    report: list = []
    assert control.gc_segments(only=name, report=report) == []
    assert [r.path for r in report] == [str(path)]
    with pytest.raises(ControlError):
        request_limit(name, 8 << 20, wait_s=0)
    assert snapshot(path) == before


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=foreign.filter(bool))
def test_gc_leaves_a_dead_creators_half_written_file_that_is_not_ours(planted, data):
    name, path = planted(data, partial=True)
    before = snapshot(path)
    report: list = []
    assert control.gc_segments(only=name, report=report) == []
    assert len(report) == 1 and str(path) in str(report[0]), report
    assert "\n" not in str(report[0]) and "named like a segment being written" in str(report[0])
    assert snapshot(path) == before


@pytest.mark.parametrize(("content", "collected"), [
    (b"", True),  # a creator that died between open and its first write
    (bytes(seg_bytes(1)[:segment.HEAD.size]), True),  # ...after writing the magic first
    (bytes(segment.HEAD.size), False),  # zeros: never what a workbench writes first
], ids=["empty", "magic", "zeros"])
def test_gc_collects_exactly_our_own_half_written_files(planted, content, collected):
    name, path = planted(content, partial=True)
    removed = control.gc_segments(only=name)
    assert (removed == [path.name]) is collected and path.exists() is not collected


def test_delete_force_removes_our_own_unreadable_segment(planted):
    data = seg_bytes(1, version=1)  # ours (magic and header) but another version
    name, path = planted(bytes(data))
    with pytest.raises(ControlError, match="pass --force to remove it"):
        control.delete_segment(name)
    assert path.exists()
    control.delete_segment(name, force=True)
    assert not path.exists()


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={**os.environ, **env})


def test_kvctl_delete_force_in_a_real_process_leaves_another_programs_file(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    victim = shm / "wbkv_theirs"
    victim.write_bytes(b"PGDMP\x00 a database dump that happens to sit here" + bytes(300))
    before = snapshot(victim)
    env = {"WORKBENCH_KV_SHM_DIR": str(shm)}
    for flags in ([], ["--force"]):
        r = cli("kvctl", "delete", "theirs", *flags, env=env)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert "left alone" in lines[0] and "magic" in lines[0], lines
    r = cli("kvctl", "gc", "--verbose", env=env)
    assert r.returncode == 0 and str(victim) in r.stderr
    assert snapshot(victim) == before


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
def test_a_worker_leaves_what_is_not_its_socket_at_its_path(tmp_path, kind):
    """A stale socket of a dead worker is replaced; a file, directory or link is refused."""
    path = tmp_path / "w0.sock"
    if kind == "file":
        path.write_text("another program's file\n")
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "elsewhere")
    cfg = {"geometry": {"num_layers": 2, "kv_heads": 2, "head_dim": 64, "num_blocks": 64},
           "path": str(path), "parent": os.getpid(), "name": "w"}
    r = subprocess.run([sys.executable, "-m", "workbench.transport.server", json.dumps(cfg)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "not this user's socket" in lines[0], \
        r.stderr
    assert path.is_symlink() if kind == "symlink" else path.exists()
    if kind == "file":
        assert path.read_text() == "another program's file\n"
